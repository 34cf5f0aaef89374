package consumer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// A handler of one statement per record on pgfence, whose statements the transaction queues:
// the third record's statement violates a constraint, which surfaces only when the batch is
// flushed before the commit, not from the handler's Exec. The batch rolls back, the consumer
// finds the record by applying one record at a time, dead-letters it, and applies the others.
func TestPipelinedStatementFailureDeadLettersTheRecord(t *testing.T) {
	pool, _ := testenv.Postgres(t)
	ctx := testenv.Context(t, time.Minute)
	if _, err := pool.Exec(ctx, `CREATE TABLE readings (device text PRIMARY KEY, reading bigint NOT NULL CHECK (reading >= 0))`); err != nil {
		t.Fatal(err)
	}
	store, err := pgfence.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	brokers := fakeKafka(t, kfake.SeedTopics(1, "telemetry", "telemetry.dlq"))
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("telemetry"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	values := []string{"1", "2", "-3", "4", "5"} // the third breaks the CHECK
	var recs []*kgo.Record
	for i, v := range values {
		recs = append(recs, &kgo.Record{Key: fmt.Appendf(nil, "d%d", i), Value: []byte(v)})
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	handler := func(ctx context.Context, tx pgx.Tx, b *consumer.Batch) error {
		for _, r := range b.Records {
			if _, err := tx.Exec(ctx, `INSERT INTO readings VALUES ($1, $2::text::bigint)`, string(r.Key), string(r.Value)); err != nil {
				return err
			}
		}
		return nil
	}
	m := newMeter()
	c, err := consumer.New("g", []string{"telemetry"}, store, handler, consumer.Kafka(fastKafka(brokers)...),
		consumer.Logger(quiet), consumer.MeterProvider(m))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	waitFor(t, "the four good records applied", 30*time.Second, func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM readings`).Scan(&n)
		return n == 4
	})
	waitFor(t, "the poison record dead-lettered", 30*time.Second, func() bool {
		return m.sum(t, "baton.consumer.records.dead_lettered") == 1
	})
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT device FROM readings ORDER BY device`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[d0 d1 d3 d4]" {
		t.Errorf("applied %v, want [d0 d1 d3 d4]: every record but the poison one", got)
	}
	rd, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("telemetry.dlq"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	dl := rd.PollFetches(pctx).Records()
	if len(dl) != 1 || string(dl[0].Key) != "d2" {
		t.Fatalf("dead-letter topic holds %d records, want the poison one (d2)", len(dl))
	}
}
