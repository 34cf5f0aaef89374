package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkEndToEnd measures consuming a pre-produced topic to completion on the real broker
// into the real PostgreSQL, five ways side by side:
//
//	a-consume   raw franz-go group member that polls and counts: the consume ceiling
//	a2-upsert   raw franz-go poll loop; per poll, one transaction per partition (concurrently)
//	            with a pipelined pgx.Batch upsert of its records: the raw batched-upsert ceiling
//	a3-upsert-1000  the same, in transactions of at most 1000 records (Baton's default batch
//	            bound), which turns out faster than a2's whole-fetch transactions
//	b-unfenced  consumer.Consumer over a sink that keeps no fence (begin, handler, commit),
//	            the handler doing the same pipelined upsert: Baton's runtime minus the fence
//	c-baton     consumer.Consumer over pgfence, the same handler inside the fenced transaction
//
// Every iteration consumes the whole topic once with a fresh consumer group, from the start,
// into a freshly truncated table; the records are produced once per run, outside the timer.
// Metrics: records/s (from client start to the last record applied, group join included),
// p50-ms/p99-ms of one batch's transaction (begin to commit), rec/batch, tx-inflight (the mean
// number of transactions in flight: summed batch time over wall time), rss-MiB (the
// highest VmRSS sampled during the iteration, after a GC returned the earlier variants' heap)
// and hwm-MiB (VmHWM, reset before the iteration). The sub-benchmark "paired" runs a2, a3, b and c
// back to back in each iteration, in rotating order, and reports their rates and the median
// ratios c/b, c/a2 and c/a3 of neighbouring runs: on a shared machine, the ratios to read.
//
//	go test -run '^$' -bench EndToEnd -benchtime 1x -count 3 ./consumer/
//	go test -run '^$' -bench 'EndToEnd/paired' -benchtime 3x ./consumer/
//
// BATON_BENCH_RECORDS sets the record count (default 200000, over 1000 keys).
func BenchmarkEndToEnd(b *testing.B) {
	brokers := testenv.KafkaBrokers(b)
	base, _ := testenv.Postgres(b)
	ctx := context.Background()
	const keys = 1000
	n := 200_000
	if v := os.Getenv("BATON_BENCH_RECORDS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < keys {
			b.Fatalf("BATON_BENCH_RECORDS=%q: want an integer >= %d", v, keys)
		}
	}
	perKey := n / keys
	n = perKey * keys
	if _, err := base.Exec(ctx, `CREATE TABLE bench_kv (key text PRIMARY KEY, v bigint NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	// One connection per partition for every variant, so no variant waits for the pool.
	cfg := base.Config()
	cfg.MaxConns = 12
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close) // before testenv drops the schema (cleanups run last first)
	fenced, err := pgfence.New(pool)
	if err != nil {
		b.Fatal(err)
	}
	if err := fenced.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	topic := testenv.NewTopic(b, brokers, 12)
	produceSeq(b, brokers, topic, keys, 1, perKey)

	e := &e2e{brokers: brokers, topic: topic, pool: pool, n: int64(n)}
	variants := []struct {
		name string
		run  func(b *testing.B, group string) *stats
	}{
		{"a-consume", e.rawConsume},
		{"a2-upsert", func(b *testing.B, group string) *stats { return e.rawUpsert(b, group, 0) }},
		{"a3-upsert-1000", func(b *testing.B, group string) *stats { return e.rawUpsert(b, group, 1000) }},
		{"b-unfenced", func(b *testing.B, group string) *stats { return e.baton(b, group, unfencedSink{pool}) }},
		{"c-baton", func(b *testing.B, group string) *stats { return e.baton(b, group, fenced) }},
	}
	// iteration runs one variant once over the whole topic, from a fresh group into an empty
	// table, after returning the earlier iterations' heap to the OS.
	iteration := func(b *testing.B, run func(*testing.B, string) *stats) *stats {
		if _, err := pool.Exec(ctx, `TRUNCATE bench_kv`); err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		debug.FreeOSMemory()
		// Reset VmHWM (Linux >= 4.0); without it hwm-MiB covers the whole process.
		_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
		rss := sampleRSS()
		st := run(b, testenv.UniqueName("bench"))
		st.rss = rss()
		return st
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			var all stats
			b.StopTimer()
			for range b.N {
				all.add(iteration(b, v.run))
				if err := e.check(ctx, perKey, v.name); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/all.wall.Seconds(), "records/s")
			if len(all.lat) > 0 {
				slices.Sort(all.lat)
				b.ReportMetric(ms(all.lat[len(all.lat)/2]), "p50-ms")
				b.ReportMetric(ms(all.lat[len(all.lat)*99/100]), "p99-ms")
				b.ReportMetric(float64(n)*float64(b.N)/float64(len(all.lat)), "rec/batch")
				var busy time.Duration
				for _, d := range all.lat {
					busy += d
				}
				// How much of the 12-way parallelism the variant used.
				b.ReportMetric(busy.Seconds()/all.wall.Seconds(), "tx-inflight")
			}
			b.ReportMetric(float64(all.rss)/(1<<20), "rss-MiB")
			if hwm := procStatus("VmHWM"); hwm > 0 {
				b.ReportMetric(float64(hwm)/(1<<20), "hwm-MiB")
			}
		})
	}
	// paired runs a2, a3, b and c back to back in every iteration, in an order that rotates
	// between iterations, so that load from other processes on a shared machine hits them
	// alike; the ratios are the medians over iterations of the ratios of neighbouring runs.
	b.Run("paired", func(b *testing.B) {
		b.StopTimer()
		trio := variants[1:]
		var wall [4]time.Duration
		var cb, ca2, ca3 []float64
		for range b.N {
			var took [4]time.Duration
			shift := int(e2eRuns.Add(1))
			for j := range trio {
				k := (j + shift) % len(trio)
				took[k] = iteration(b, trio[k].run).wall
				if err := e.check(ctx, perKey, trio[k].name); err != nil {
					b.Fatal(err)
				}
			}
			for k := range wall {
				wall[k] += took[k]
			}
			// A rate ratio is the inverse ratio of the times taken.
			cb = append(cb, took[2].Seconds()/took[3].Seconds())
			ca2 = append(ca2, took[0].Seconds()/took[3].Seconds())
			ca3 = append(ca3, took[1].Seconds()/took[3].Seconds())
		}
		recs := float64(n) * float64(b.N)
		b.ReportMetric(recs/wall[0].Seconds(), "a2-records/s")
		b.ReportMetric(recs/wall[1].Seconds(), "a3-records/s")
		b.ReportMetric(recs/wall[2].Seconds(), "b-records/s")
		b.ReportMetric(recs/wall[3].Seconds(), "c-records/s")
		b.ReportMetric(median(cb), "c/b")
		b.ReportMetric(median(ca2), "c/a2")
		b.ReportMetric(median(ca3), "c/a3")
	})
}

func median(xs []float64) float64 {
	slices.Sort(xs)
	return xs[len(xs)/2]
}

var e2eRuns atomic.Int64 // rotates the paired variants' order between iterations and runs

type e2e struct {
	brokers []string
	topic   string
	pool    *pgxpool.Pool
	n       int64
}

// stats are what one iteration measured: wall time, batch-apply latencies, highest RSS.
type stats struct {
	wall time.Duration
	mu   sync.Mutex
	lat  []time.Duration
	rss  int64
}

// start starts the benchmark timer and the wall clock; stop stops both.
func (s *stats) start(b *testing.B) time.Time {
	b.StartTimer()
	return time.Now()
}

func (s *stats) stop(b *testing.B, start time.Time) {
	s.wall += time.Since(start)
	b.StopTimer()
}

func (s *stats) batch(d time.Duration) {
	s.mu.Lock()
	s.lat = append(s.lat, d)
	s.mu.Unlock()
}

func (s *stats) add(o *stats) {
	s.wall += o.wall
	s.lat = append(s.lat, o.lat...)
	s.rss = max(s.rss, o.rss)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (e *e2e) kafka(group string) []kgo.Opt {
	return []kgo.Opt{kgo.SeedBrokers(e.brokers...), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.ConsumerGroup(group), kgo.ConsumeTopics(e.topic)}
}

// check verifies that the last iteration left every key at its last sequence number.
func (e *e2e) check(ctx context.Context, perKey int, name string) error {
	if name == "a-consume" {
		return nil
	}
	var rows, bad int
	if err := e.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE v <> $1) FROM bench_kv`, perKey).Scan(&rows, &bad); err != nil {
		return err
	}
	if rows != int(e.n)/perKey || bad != 0 {
		return fmt.Errorf("%s: %d rows, %d not at their last sequence number %d", name, rows, bad, perKey)
	}
	return nil
}

// rawConsume is the consume ceiling: poll and count, nothing else.
func (e *e2e) rawConsume(b *testing.B, group string) *stats {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	st := &stats{}
	start := st.start(b)
	cl, err := kgo.NewClient(e.kafka(group)...)
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	var got int64
	for got < e.n {
		fs := cl.PollFetches(ctx)
		if err := fetchErr(fs); err != nil {
			b.Fatal(err)
		}
		got += int64(fs.NumRecords())
	}
	st.stop(b, start)
	return st
}

// rawUpsert is the raw batched-upsert ceiling: per poll, the partitions' records are upserted
// concurrently, one pipelined batch per transaction, and the next poll waits for them (the
// usual franz-go shape; no fence). With chunk 0 a partition's records of one poll go in one
// transaction (however many a fetch brought, 16667 here); otherwise in transactions of at
// most chunk records, one after the other, as Baton does with MaxInflightPerPartition.
func (e *e2e) rawUpsert(b *testing.B, group string, chunk int) *stats {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	st := &stats{}
	start := st.start(b)
	cl, err := kgo.NewClient(e.kafka(group)...)
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	var got int64
	for got < e.n {
		fs := cl.PollFetches(ctx)
		if err := fetchErr(fs); err != nil {
			b.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for recs := p.Records; len(recs) > 0; {
					m := len(recs)
					if chunk > 0 {
						m = min(m, chunk)
					}
					start := time.Now()
					if err := e.upsertTx(ctx, recs[:m]); err != nil {
						select {
						case errs <- err:
						default:
						}
						return
					}
					st.batch(time.Since(start))
					recs = recs[m:]
				}
			}()
		})
		wg.Wait()
		select {
		case err := <-errs:
			b.Fatal(err)
		default:
		}
		got += int64(fs.NumRecords())
	}
	st.stop(b, start)
	return st
}

func (e *e2e) upsertTx(ctx context.Context, recs []*kgo.Record) error {
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var bt pgx.Batch
	if err := queueUpserts(&bt, recs); err != nil {
		return err
	}
	if err := tx.SendBatch(ctx, &bt).Close(); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

const benchUpsert = `INSERT INTO bench_kv (key, v) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET v = excluded.v`

// queueUpserts queues one upsert per record: the key's value becomes the record's sequence.
func queueUpserts(bt *pgx.Batch, recs []*kgo.Record) error {
	for _, r := range recs {
		seq, err := strconv.ParseInt(string(r.Value), 10, 64)
		if err != nil {
			return consumer.Permanent(err)
		}
		bt.Queue(benchUpsert, string(r.Key), seq)
	}
	return nil
}

func upserter(context.Context, fence.Key, fence.Token) (consumer.Handler[pgx.Tx], error) {
	return consumer.Handler[pgx.Tx](func(ctx context.Context, tx pgx.Tx, b *consumer.Batch) error {
		var bt pgx.Batch
		if err := queueUpserts(&bt, b.Records); err != nil {
			return err
		}
		return tx.SendBatch(ctx, &bt).Close()
	}), nil
}

// baton runs a consumer.Consumer over sink until every record was applied.
func (e *e2e) baton(b *testing.B, group string, sink fence.Sink[pgx.Tx]) *stats {
	ts := &timedSink{Sink: sink, st: &stats{}, pos: map[int32]int64{}, want: e.n, done: make(chan struct{})}
	c, err := consumer.New(group, []string{e.topic}, ts, nil, consumer.PerPartition(upserter),
		consumer.Kafka(kgo.SeedBrokers(e.brokers...), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())),
		consumer.Logger(quiet))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	start := ts.st.start(b)
	go func() { errc <- c.Run(ctx) }()
	select {
	case <-ts.done:
	case err := <-errc:
		b.Fatalf("Run returned before every record was applied: %v", err)
	case <-time.After(5 * time.Minute):
		cancel()
		<-errc
		b.Fatalf("%d of %d records applied after 5 minutes", ts.applied.Load(), e.n)
	}
	ts.st.stop(b, start)
	cancel()
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	return ts.st
}

// timedSink times each committed Apply (begin to commit) and counts the records it applied
// from the advance of the partition's position (the topic's offsets are dense: no
// transactions, no compaction), so that only committed batches count.
type timedSink struct {
	fence.Sink[pgx.Tx]
	st      *stats
	mu      sync.Mutex
	pos     map[int32]int64
	applied atomic.Int64
	want    int64
	done    chan struct{}
}

func (s *timedSink) Claim(ctx context.Context, k fence.Key, t fence.Token, claimant string) (fence.State, error) {
	st, err := s.Sink.Claim(ctx, k, t, claimant)
	if err == nil {
		s.mu.Lock()
		s.pos[k.Partition] = st.Position
		s.mu.Unlock()
	}
	return st, err
}

func (s *timedSink) Apply(ctx context.Context, k fence.Key, t fence.Token, first, position int64, fn func(context.Context, pgx.Tx) error) error {
	start := time.Now()
	if err := s.Sink.Apply(ctx, k, t, first, position, fn); err != nil {
		return err
	}
	s.st.batch(time.Since(start))
	s.mu.Lock()
	prev := s.pos[k.Partition]
	s.pos[k.Partition] = position
	s.mu.Unlock()
	if s.applied.Add(position-prev) == s.want {
		close(s.done)
	}
	return nil
}

// unfencedSink is a fence.Sink that keeps no fence: every claim starts from Kafka's
// committed offset and every Apply is begin, fn, commit. It protects nothing; it exists to
// price the fence.
type unfencedSink struct{ pool *pgxpool.Pool }

func (unfencedSink) Claim(context.Context, fence.Key, fence.Token, string) (fence.State, error) {
	return fence.State{Position: fence.NoPosition}, nil
}

func (unfencedSink) Load(context.Context, fence.Key) (fence.State, error) {
	return fence.State{Position: fence.NoPosition}, nil
}

func (s unfencedSink) Apply(ctx context.Context, _ fence.Key, _ fence.Token, _, _ int64, fn func(context.Context, pgx.Tx) error) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := fn(ctx, tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func (unfencedSink) Advance(context.Context, pgx.Tx, fence.Key, fence.Token, int64, int64) error {
	return nil
}

func (unfencedSink) Recover(context.Context, fence.Key, fence.Token, int64, string, string) (fence.Token, error) {
	return fence.Token{}, errors.New("unfenced sink: nothing to recover")
}

func (unfencedSink) Recoveries(context.Context, fence.Key) ([]fence.Recovery, error) {
	return nil, nil
}

func fetchErr(fs kgo.Fetches) error {
	for _, fe := range fs.Errors() {
		return fmt.Errorf("fetch %s/%d: %w", fe.Topic, fe.Partition, fe.Err)
	}
	return nil
}

// sampleRSS samples VmRSS every 50ms until the returned function is called, which returns
// the highest sample.
func sampleRSS() func() int64 {
	var peak atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			if v := procStatus("VmRSS"); v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	return func() int64 {
		close(stop)
		<-done
		return peak.Load()
	}
}

// procStatus returns a "kB" field of /proc/self/status in bytes, 0 if unavailable.
func procStatus(field string) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
