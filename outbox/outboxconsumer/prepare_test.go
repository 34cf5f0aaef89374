package outboxconsumer_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/outboxconsumer"
)

// prepHandler is a handler that records what reaches it.
type prepHandler struct {
	records  []*kgo.Record
	prepared []any
}

func (h *prepHandler) Handle(_ context.Context, _ int, b *consumer.Batch) error {
	h.records, h.prepared = b.Records, b.Prepared
	return nil
}

// seqKeyed is a KeyedSink that admits every sequence except those in dup (a relay's re-publish).
type seqKeyed struct{ dup map[int64]bool }

func (s seqKeyed) Admit(_ context.Context, _ int, _, _ string, _ fence.Token, seq int64) (fence.Verdict, error) {
	if s.dup[seq] {
		return fence.Duplicate, nil
	}
	return fence.Admitted, nil
}

func envelopeRecord(offset, seq int64) *kgo.Record {
	return &kgo.Record{Topic: "in", Partition: 0, Offset: offset, Key: []byte("k"), Value: []byte(strconv.FormatInt(seq, 10)),
		Headers: []kgo.RecordHeader{
			{Key: "baton-token", Value: []byte("1.1")},
			{Key: "baton-seq", Value: []byte(strconv.FormatInt(seq, 10))},
			{Key: "baton-source", Value: []byte("g/src/0")},
		}}
}

// The inbox drops a duplicate from the batch: its prepared result goes with it, so the
// wrapped handler gets Prepared[i] for Records[i] (the full Prepared slice passed with the
// filtered Records would hand record seq 3 seq 2's result).
func TestInboxKeepsPreparedAligned(t *testing.T) {
	in, err := outbox.NewInbox[int]("r", seqKeyed{dup: map[int64]bool{2: true}})
	if err != nil {
		t.Fatal(err)
	}
	h := &prepHandler{}
	w := outboxconsumer.Handler(in, h.Handle)
	b := &consumer.Batch{Key: fence.Key{Group: "g", Topic: "in", Partition: 0}, Token: fence.Token{Era: 1, Epoch: 1}}
	for i := int64(1); i <= 4; i++ {
		b.Records = append(b.Records, envelopeRecord(i+9, i))
		b.Prepared = append(b.Prepared, fmt.Sprintf("prepared:%d", i))
	}
	if err := w(context.Background(), 0, b); err != nil {
		t.Fatal(err)
	}
	if len(h.records) != 3 || len(h.prepared) != len(h.records) {
		t.Fatalf("handler got %d records and %d prepared results, want 3 and 3", len(h.records), len(h.prepared))
	}
	for i, r := range h.records {
		if want := "prepared:" + string(r.Value); h.prepared[i] != want {
			t.Errorf("record seq %s handed %v, want %s", r.Value, h.prepared[i], want)
		}
	}
	if len(b.Records) != 4 || len(b.Prepared) != 4 || b.Prepared[1] != "prepared:2" {
		t.Errorf("the consumer's batch was modified: %d records, prepared %v", len(b.Records), b.Prepared)
	}
}
