package consumer_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
)

// A claim whose position is the last record of a committed Kafka transaction seeks to
// position + 1, the transaction's commit marker: the first batch fetched from the seek starts
// at position + 2. The poll that returns it began before the seek (the poller waits in
// PollFetches while a partition is claimed), and offsets cannot tell that gap from a stale
// cursor's, so the batch is dropped and the seek redone: the cost is one more seek and fetch
// per claim, bounded. What must hold: the redo happens once, not for ever, and every record
// after the position is applied.
func TestFirstBatchAfterAClaimAtACommitMarkerCostsOneSeek(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	ctx := context.Background()
	tx, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("orders"),
		kgo.TransactionalID("orders-producer"))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	for txn := 0; txn < 2; txn++ { // offsets 0..2, marker 3; offsets 4..6, marker 7
		if err := tx.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			if err := tx.ProduceSync(ctx, &kgo.Record{Key: []byte("k"), Value: []byte("v")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatal(err)
		}
	}
	store := newStore(t)
	k := fence.Key{Group: "g", Topic: "orders", Partition: 0}
	tok, err := store.Claim(ctx, k, fence.Token{Epoch: 1}, "earlier-owner")
	if err != nil {
		t.Fatal(err)
	}
	// The earlier owner applied the first transaction: position 2, the commit marker at 3.
	if err := store.Apply(ctx, k, tok.Token, 0, 2, func(context.Context, *memfence.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	c, err := consumer.New("g", []string{"orders"}, store, nil, consumer.PerPartition(consumer.Factory[*memfence.Tx](func(context.Context, fence.Key, fence.Token) (consumer.Handler[*memfence.Tx], error) {
		return consumer.Handler[*memfence.Tx](func(context.Context, *memfence.Tx, *consumer.Batch) error { return nil }), nil
	})), consumer.Kafka(append(fastKafka(brokers), kgo.FetchIsolationLevel(kgo.ReadCommitted()))...),
		consumer.Logger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	waitFor(t, "the second transaction applied", 30*time.Second, func() bool {
		st, _ := store.Load(ctx, k)
		return st.Position == 6
	})
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	if out := logs.String(); strings.Count(out, "dropped a batch fetched before this partition's seek") > 1 {
		t.Fatalf("the first batch after the claim's seek to the commit marker at 3 was dropped and the seek redone more than once:\n%s", grepLines(out, "dropped a batch"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
