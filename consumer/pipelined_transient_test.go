package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// A unique violation caused by a concurrent writer of the same key (a writer outside this
// partition inserted the row between the handler's read and its insert) passes on a retry: the
// read then finds the row and the handler updates it. A batch of one record that hits it on
// pgfence, whose transaction queues the insert, is retried and applied, not dead-lettered.
func TestPipelinedConcurrentUniqueViolationIsRetried(t *testing.T) {
	pool, _ := testenv.Postgres(t)
	ctx := testenv.Context(t, time.Minute)
	if _, err := pool.Exec(ctx, `CREATE TABLE counts (id text PRIMARY KEY, n bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	store, err := pgfence.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	brokers := fakeKafka(t, kfake.SeedTopics(1, "hits", "hits.dlq"))
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("hits"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte("page")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var raced atomic.Bool
	handler := func(ctx context.Context, tx pgx.Tx, b *consumer.Batch) error {
		for _, r := range b.Records {
			var n int64
			err := tx.QueryRow(ctx, `SELECT n FROM counts WHERE id = $1`, string(r.Key)).Scan(&n)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				if raced.CompareAndSwap(false, true) {
					// Another writer of the key commits between the read and the insert.
					if _, err := pool.Exec(ctx, `INSERT INTO counts VALUES ($1, 1)`, string(r.Key)); err != nil {
						return err
					}
				}
				if _, err := tx.Exec(ctx, `INSERT INTO counts VALUES ($1, 1)`, string(r.Key)); err != nil {
					return err
				}
			case err != nil:
				return err
			default:
				if _, err := tx.Exec(ctx, `UPDATE counts SET n = n + 1 WHERE id = $1`, string(r.Key)); err != nil {
					return err
				}
			}
		}
		return nil
	}
	m := newMeter()
	c, err := consumer.New("g", []string{"hits"}, store, handler, consumer.Kafka(fastKafka(brokers)...),
		consumer.Logger(quiet), consumer.MeterProvider(m), consumer.RetryBackoff(10*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	waitFor(t, "the record applied or dead-lettered", 30*time.Second, func() bool {
		var n int64
		_ = pool.QueryRow(ctx, `SELECT n FROM counts WHERE id = 'page'`).Scan(&n)
		return n == 2 || m.sum(t, "baton.consumer.records.dead_lettered") > 0
	})
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	if d := m.sum(t, "baton.consumer.records.dead_lettered"); d != 0 {
		t.Errorf("%d record dead-lettered over a unique violation a retry would have passed", d)
	}
	var n int64
	if err := pool.QueryRow(ctx, `SELECT n FROM counts WHERE id = 'page'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("counts page = %d, want 2: the concurrent writer's hit and the record's", n)
	}
}
