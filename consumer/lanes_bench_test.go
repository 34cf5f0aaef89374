package consumer_test

import (
	"context"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkLanes measures per-key lanes on the real broker into the real PostgreSQL: a
// handler whose Prepare is a 5 ms simulated remote call per record and whose Handle is the
// fenced fold of the real-service tests (pgFolder), 12 partitions, 1000 keys, run with lanes=1
// and lanes=16 back to back in every iteration (fresh group each, the table truncated), so the
// ratio compares neighbouring runs on a shared machine. Metrics: each variant's records/s,
// from the first Prepare call to the last record committed (the group join excluded), and
// the ratio lanes16/lanes1.
//
//	go test -run '^$' -bench Lanes -benchtime 1x ./consumer/
//
// BATON_BENCH_LANES_RECORDS sets the record count (default 24000: 24 per key; lanes=1 then
// takes about 10 s, bound by 12 partitions x 200 calls/s).
func BenchmarkLanes(b *testing.B) {
	brokers := testenv.KafkaBrokers(b)
	pool, _ := testenv.Postgres(b)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, pgSchema); err != nil {
		b.Fatal(err)
	}
	sink, err := pgfence.New(pool)
	if err != nil {
		b.Fatal(err)
	}
	if err := sink.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	const keys = 1000
	n := 24
	if v := os.Getenv("BATON_BENCH_LANES_RECORDS"); v != "" {
		total, err := strconv.Atoi(v)
		if err != nil || total < keys {
			b.Fatalf("BATON_BENCH_LANES_RECORDS=%q: want a number of records >= %d", v, keys)
		}
		n = total / keys
	}
	topic := testenv.NewTopic(b, brokers, 12)
	produceSeq(b, brokers, topic, keys, 1, n)
	want := int64(keys * n)

	// run consumes the whole topic once with lanes, returning records/s.
	run := func(lanes int) float64 {
		if _, err := pool.Exec(ctx, `TRUNCATE kv, writes`); err != nil {
			b.Fatal(err)
		}
		var first atomic.Int64 // unix nanos of the first Prepare call
		remote := func(ctx context.Context, _ *kgo.Record) error {
			first.CompareAndSwap(0, time.Now().UnixNano())
			t := time.NewTimer(5 * time.Millisecond)
			defer t.Stop()
			select {
			case <-t.C:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		var checks laneChecks
		st := newStages(func(ctx context.Context, k fence.Key, tk fence.Token) (*laneHandler[pgx.Tx], error) {
			h, err := pgFolder(ctx, k, tk)
			if err != nil {
				return nil, err
			}
			return withPrepare(h, &checks, remote), nil
		})
		c, err := consumer.New(testenv.UniqueName("g"), []string{topic}, sink, nil, st.perPartition(),
			consumer.Kafka(realKafka(brokers)...), consumer.Logger(quiet), st.lanes(lanes))
		if err != nil {
			b.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.Run(rctx) }()
		deadline := time.Now().Add(10 * time.Minute)
		var applied int64
		for {
			if err := pool.QueryRow(ctx, `SELECT coalesce(sum(count), 0) FROM kv`).Scan(&applied); err != nil {
				b.Fatal(err)
			}
			if applied >= want || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		end := time.Now()
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		if applied != want {
			b.Fatalf("lanes %d: %d of %d records applied", lanes, applied, want)
		}
		if v := checks.Violations(); len(v) > 0 {
			b.Fatalf("lanes %d: %d violations, first %s", lanes, len(v), v[0])
		}
		var bad int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM kv WHERE count <> $1 OR last <> $1`, n).Scan(&bad); err != nil || bad != 0 {
			b.Fatalf("lanes %d: %d keys differ from their fold (%v)", lanes, bad, err)
		}
		var batches int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM writes`).Scan(&batches); err != nil {
			b.Fatal(err)
		}
		b.Logf("lanes %d: %d transactions, %.1f records each", lanes, batches, float64(want)/float64(batches))
		return float64(want) / end.Sub(time.Unix(0, first.Load())).Seconds()
	}

	var r1, r16 float64
	for i := 0; b.Loop(); i++ {
		a, c := run(1), run(16)
		r1, r16 = r1+a, r16+c
		b.Logf("iteration %d: lanes=1 %.0f records/s, lanes=16 %.0f records/s, ratio %.1f", i, a, c, c/a)
	}
	iters := float64(b.N)
	b.ReportMetric(r1/iters, "lanes1-rec/s")
	b.ReportMetric(r16/iters, "lanes16-rec/s")
	b.ReportMetric(r16/r1, "ratio")
}
