package consumer_test

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
)

// FuzzDeadLetterHeaders: whatever headers a poison record carries, forged baton.dlq.* ones
// included, its dead-letter copy has each baton.dlq.* header exactly once with Baton's value,
// and every other header of the record, in order.
func FuzzDeadLetterHeaders(f *testing.F) {
	f.Add([]byte("a=1\nbaton.dlq.reason=forged\nBATON.DLQ.OFFSET=0"), "orders", int32(3), int64(42), "bad json")
	f.Add([]byte("baton.dlq.token=99.99\nbaton.dlq.group=evil\n=\n\x00=\xff"), "", int32(0), int64(0), "")
	f.Fuzz(func(t *testing.T, hdrs []byte, topic string, part int32, offset int64, reason string) {
		var in []kgo.RecordHeader
		for _, line := range bytes.Split(hdrs, []byte{'\n'}) {
			if len(line) > 0 {
				k, v, _ := bytes.Cut(line, []byte{'='})
				in = append(in, kgo.RecordHeader{Key: string(k), Value: v})
			}
		}
		r := &kgo.Record{Topic: topic, Partition: part, Offset: offset, Headers: in}
		k := fence.Key{Group: "g", Topic: topic, Partition: part}
		tok := fence.Token{Era: 1, Epoch: 7}
		out := consumer.DeadLetterHeaders(r, errors.New(reason), k, tok)
		want := map[string]string{
			consumer.HeaderDLQReason: reason, consumer.HeaderDLQGroup: "g", consumer.HeaderDLQTopic: topic,
			consumer.HeaderDLQPartition: strconv.Itoa(int(part)), consumer.HeaderDLQOffset: strconv.FormatInt(offset, 10),
			consumer.HeaderDLQToken: "1.7",
		}
		var kept []kgo.RecordHeader
		seen := map[string]int{}
		for _, h := range out {
			if strings.HasPrefix(strings.ToLower(h.Key), "baton.dlq.") {
				seen[h.Key]++
				if h.Key == consumer.HeaderDLQReason {
					if !strings.HasPrefix(reason, string(h.Value)) || len(h.Value) > consumer.MaxDeadLetterReason ||
						len(reason) <= consumer.MaxDeadLetterReason && string(h.Value) != reason {
						t.Fatalf("reason %q of %q: want the reason cut to at most %d bytes", h.Value, reason, consumer.MaxDeadLetterReason)
					}
					continue
				}
				if w, ok := want[h.Key]; !ok || w != string(h.Value) {
					t.Fatalf("header %q = %q, want Baton's %q", h.Key, h.Value, w)
				}
				continue
			}
			kept = append(kept, h)
		}
		for k := range want {
			if seen[k] != 1 {
				t.Fatalf("header %s appears %d times", k, seen[k])
			}
		}
		var wantKept []kgo.RecordHeader
		for _, h := range in {
			if !strings.HasPrefix(strings.ToLower(h.Key), "baton.dlq.") {
				wantKept = append(wantKept, h)
			}
		}
		if len(kept) != len(wantKept) {
			t.Fatalf("kept %d of the record's %d own headers", len(kept), len(wantKept))
		}
		for i := range kept {
			if kept[i].Key != wantKept[i].Key || !bytes.Equal(kept[i].Value, wantKept[i].Value) {
				t.Fatalf("header %d: %q, want %q", i, kept[i].Key, wantKept[i].Key)
			}
		}
	})
}

// A handler's error quoting a large poison record does not make its dead-letter copy twice the
// record's size (over the outbox's message bound, or the producer's, for a record the source
// topic took, which would stop or stall the partition): the reason header is bounded, cut at a
// rune boundary.
func TestDeadLetterReasonIsBounded(t *testing.T) {
	value := strings.Repeat("é", 300_000) // 600 kB
	r := &kgo.Record{Topic: "orders", Value: []byte(value)}
	cause := errors.New("cannot decode " + strconv.Quote(value))
	hs := consumer.DeadLetterHeaders(r, cause, fence.Key{Group: "g", Topic: "orders"}, fence.Token{Era: 1, Epoch: 1})
	size := 0
	for _, h := range hs {
		size += len(h.Key) + len(h.Value)
		if h.Key == consumer.HeaderDLQReason && (!utf8.Valid(h.Value) || !strings.HasPrefix(cause.Error(), string(h.Value))) {
			t.Fatalf("reason cut inside a rune or not a prefix of the cause: %q", h.Value[max(0, len(h.Value)-8):])
		}
	}
	if size > 2*consumer.MaxDeadLetterReason {
		t.Fatalf("the copy's headers hold %d bytes for a %d-byte record; want the reason bounded", size, len(value))
	}
}
