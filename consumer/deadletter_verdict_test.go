package consumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
)

// sentinelDL is a dead-letter function whose store refuses the copy for good with an error that
// happens to wrap a fence sentinel (its own deduplication table, say).
type sentinelDL struct {
	dlHandler
	tried atomic.Int32
}

func (h *sentinelDL) DeadLetter(context.Context, *memfence.Tx, *consumer.Batch, *kgo.Record) error {
	h.tried.Add(1)
	return consumer.Permanent(fmt.Errorf("my dead-letter table: %w", fence.ErrDuplicate))
}

// A dead-letter function's error is not a verdict (mutant DeadLetterErrorReadAsVerdict): the
// error of a FencedDeadLetters function is the handler's, never the sink's verdict on the
// dead-letter transaction.
// Interleaving: the handler fails record X permanently; deadLetter's transaction advances the
// fence over X and calls DeadLetter, which refuses the copy for good with an error wrapping
// fence.ErrDuplicate; the transaction rolls back (X neither applied nor dead-lettered). Read
// as the sink's ErrDuplicate (errors.Is on the whole error, through handlerError), the worker
// marks X done and applies X+1: X is lost. It must stop the partition as any permanent
// refusal of the copy does.
func TestDeadLetterErrorWrappingAFenceSentinelIsNotAVerdict(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders", "orders.dlq"))
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("ok")}, &kgo.Record{Value: []byte("poison")}, &kgo.Record{Value: []byte("ok")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	store := newStore(t)
	h := &sentinelDL{}
	var logs syncBuffer
	c, err := consumer.New("g", []string{"orders"}, store,
		h.Handle, consumer.FencedDeadLetters(h.DeadLetter),
		consumer.Kafka(fastKafka(brokers)...), consumer.Logger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	m := start(t, c)
	waitFor(t, "DeadLetter refused the copy of the poison record", bound(30*time.Second), func() bool {
		return h.tried.Load() > 0
	})
	time.Sleep(500 * time.Millisecond) // a skip, had one started, lands meanwhile
	if err := m.stop(); err != nil {
		t.Fatal(err)
	}
	st, _ := store.Load(ctx, fence.Key{Group: "g", Topic: "orders", Partition: 0})
	if _, ok := store.Get("v/2"); ok || st.Position != 0 {
		t.Errorf("the fence is at %d and offset 2 applied=%v: the poison record (offset 1) was skipped with no dead letter", st.Position, ok)
	}
	if !strings.Contains(logs.String(), "level=ERROR msg=\"the handler refused the dead-letter copy for good") {
		t.Errorf("no ERROR for the refused copy:\n%s", logs.String())
	}
}
