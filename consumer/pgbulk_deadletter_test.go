package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/fence/pgfence/pgbulk"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// beginHook runs hook (once armed) before the next transaction begins.
type beginHook struct {
	pool  *pgxpool.Pool
	armed atomic.Bool
	hook  func(ctx context.Context)
}

func (b *beginHook) Begin(ctx context.Context) (pgx.Tx, error) {
	if b.armed.CompareAndSwap(true, false) {
		b.hook(ctx)
	}
	return b.pool.Begin(ctx)
}

// A member whose token the fence already refuses produces no dead letter: over pgbulk's Sink,
// whose transaction sends the fence statement only with the handler's first statement, the
// direct dead-lettering (a produce, no statement) must still have the fence checked first.
func TestDirectDeadLetterOverPgbulkChecksTheFenceFirst(t *testing.T) {
	pool, _ := testenv.Postgres(t)
	ctx := testenv.Context(t, time.Minute)
	store, err := pgfence.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	k := fence.Key{Group: "g", Topic: "orders", Partition: 0}
	var stale atomic.Value // the token the fence refuses once the successor claimed
	db := &beginHook{pool: pool, hook: func(ctx context.Context) {
		// A successor claims the partition between the poison batch and its dead letter.
		st, err := store.Load(ctx, k)
		if err != nil {
			t.Error(err)
			return
		}
		if _, err := store.Claim(ctx, k, fence.Token{Era: st.Token.Era, Epoch: st.Token.Epoch + 1000}, "successor"); err != nil {
			t.Error(err)
			return
		}
		stale.Store(st.Token.String())
	}}
	sink, err := pgbulk.NewSink(store, db)
	if err != nil {
		t.Fatal(err)
	}
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders", "orders.dlq"))
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte("poison")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	handler := func(ctx context.Context, tx pgx.Tx, b *consumer.Batch) error {
		db.armed.Store(true)
		return consumer.Permanent(errors.New("cannot apply"))
	}
	m := newMeter()
	c, err := consumer.New("g", []string{"orders"}, sink, handler, consumer.Kafka(fastKafka(brokers)...),
		consumer.Logger(quiet), consumer.MeterProvider(m))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	waitFor(t, "the member's dead letter refused as stale", 30*time.Second, func() bool {
		return m.sum(t, "baton.consumer.stale_refusals") > 0
	})
	_ = mb.stop()
	rd, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("orders.dlq"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	for _, r := range rd.PollFetches(pctx).Records() {
		for _, h := range r.Headers {
			if h.Key == "baton.dlq.token" && string(h.Value) == stale.Load() {
				t.Errorf("dead letter of offset %d produced under token %s, which the fence already refused: a zombie dead-lettered", r.Offset, h.Value)
			}
		}
	}
}
