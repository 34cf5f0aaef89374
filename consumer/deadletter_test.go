package consumer_test

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"testing"

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
