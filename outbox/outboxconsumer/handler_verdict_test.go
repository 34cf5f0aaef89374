package outboxconsumer_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/outboxconsumer"
)

// tokenRecord is an outbox record of source g/src/0 written under token tok ("era.epoch").
func tokenRecord(offset int64, tok string, seq int64) *kgo.Record {
	return &kgo.Record{Topic: "in", Partition: 0, Offset: offset, Key: []byte("k"), Value: []byte(tok + "#" + strconv.FormatInt(seq, 10)),
		Headers: []kgo.RecordHeader{
			{Key: "baton-token", Value: []byte(tok)},
			{Key: "baton-seq", Value: []byte(strconv.FormatInt(seq, 10))},
			{Key: "baton-source", Value: []byte("g/src/0")},
		}}
}

// Only what the inbox admits reaches the application: a record of a deposed producer (a
// token below the one already admitted for its key: Stale) is dropped like a duplicate, in
// the batch's own transaction, on the real keyed fence.
func TestHandlerPassesOnlyAdmittedRecords(t *testing.T) {
	ctx := context.Background()
	store, err := memfence.New()
	if err != nil {
		t.Fatal(err)
	}
	in, err := outbox.NewInbox[*memfence.Tx]("r", store)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	w := outboxconsumer.Handler(in, func(_ context.Context, _ *memfence.Tx, b *consumer.Batch) error {
		for _, r := range b.Records {
			got = append(got, string(r.Value))
		}
		return nil
	})
	b := &consumer.Batch{Key: fence.Key{Group: "g", Topic: "in", Partition: 0}, Token: fence.Token{Era: 1, Epoch: 1},
		Records: []*kgo.Record{
			tokenRecord(10, "1.2", 1), // the current producer
			tokenRecord(11, "1.1", 2), // its deposed predecessor, late: Stale
			tokenRecord(12, "1.2", 1), // a re-published copy: Duplicate
			tokenRecord(13, "1.2", 2), // the current producer's next
		}}
	tx, err := store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := w(ctx, tx, b); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	want := []string{"1.2#1", "1.2#2"}
	for _, v := range got {
		if v == "1.1#2" {
			t.Errorf("the deposed producer's record %s, judged Stale by the inbox, reached the application", v)
		}
	}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("the application got %q, want %q", got, want)
	}
}
