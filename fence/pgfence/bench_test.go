package pgfence

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

var _ DB = (*pgxpool.Conn)(nil)

// BenchmarkUpsert measures what the fence costs a batched write path on the real server: the
// same upsert of the same rows, in a transaction, unfenced and fenced side by side. Each
// shape has an unfenced and a fenced variant with the same round trips (begin, one pipelined
// batch or COPY+merge, commit); the fenced one adds the fence statement to the batch.
//
//	go test -run '^$' -bench Upsert -benchtime 2s -count 3 ./fence/pgfence/
//
// The same rows are rewritten every iteration, so a transaction left open by any other
// session in the same database (which holds back pruning of dead row versions) slows both
// variants progressively; point BATON_POSTGRES_URL at a database of its own to avoid that. On
// a shared machine compare the paired sub-benchmarks' fenced/unfenced metric, not the
// separate runs.
func BenchmarkUpsert(b *testing.B) {
	pool, _ := testenv.Postgres(b)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx) // one connection for everything, as one partition worker has
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	s, err := New(conn)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE bench_kv (k text PRIMARY KEY, v bigint NOT NULL)`,
		`CREATE TEMP TABLE bench_stage (k text NOT NULL, v bigint NOT NULL) ON COMMIT DELETE ROWS`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	const (
		upsert = `INSERT INTO bench_kv (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v`
		unnest = `INSERT INTO bench_kv (k, v) SELECT * FROM unnest($1::text[], $2::bigint[]) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v`
		merge  = `INSERT INTO bench_kv (k, v) SELECT k, v FROM bench_stage ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v`
	)
	k := fence.Key{Group: "bench", Topic: "t", Partition: 0}
	tok := fence.Token{Epoch: 1}
	if _, err := s.Claim(ctx, k, tok, "fencetest"); err != nil {
		b.Fatal(err)
	}
	var position int64 // the fence's position, advanced by every fenced batch

	for _, n := range []int{1, 10, 100, 1000} {
		keys := make([]string, n)
		for i := range keys {
			keys[i] = "key-" + strconv.Itoa(i)
		}
		vals := make([]int64, n)
		perRow := func(iter int64) func(*pgx.Batch) error {
			return func(bt *pgx.Batch) error {
				for _, key := range keys {
					bt.Queue(upsert, key, iter)
				}
				return nil
			}
		}
		setBased := func(iter int64) func(*pgx.Batch) error {
			return func(bt *pgx.Batch) error {
				for i := range vals {
					vals[i] = iter
				}
				bt.Queue(unnest, keys, vals)
				return nil
			}
		}
		copyRows := func(tx pgx.Tx, iter int64) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{"bench_stage"}, []string{"k", "v"},
				pgx.CopyFromSlice(n, func(i int) ([]any, error) { return []any{keys[i], iter}, nil }))
			return err
		}
		// unfenced runs queue in a transaction as one pipelined batch.
		unfenced := func(iter int64, queue func(int64) func(*pgx.Batch) error) error {
			tx, err := conn.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }()
			bt := &pgx.Batch{}
			if err := queue(iter)(bt); err != nil {
				return err
			}
			if err := tx.SendBatch(ctx, bt).Close(); err != nil {
				return err
			}
			return tx.Commit(ctx)
		}
		fenced := func(iter int64, queue func(int64) func(*pgx.Batch) error) error {
			position++
			return s.ApplyBatch(ctx, k, tok, position, position, queue(iter))
		}
		shapes := []struct {
			name             string
			unfenced, fenced func(iter int64) error
		}{
			{"batch", func(it int64) error { return unfenced(it, perRow) }, func(it int64) error { return fenced(it, perRow) }},
			{"unnest", func(it int64) error { return unfenced(it, setBased) }, func(it int64) error { return fenced(it, setBased) }},
			{"copy", func(it int64) error {
				tx, err := conn.Begin(ctx)
				if err != nil {
					return err
				}
				defer func() { _ = tx.Rollback(ctx) }()
				if err := copyRows(tx, it); err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, merge); err != nil {
					return err
				}
				return tx.Commit(ctx)
			}, func(it int64) error {
				tx, err := conn.Begin(ctx)
				if err != nil {
					return err
				}
				defer func() { _ = tx.Rollback(ctx) }()
				if err := copyRows(tx, it); err != nil {
					return err
				}
				position++
				if err := s.AdvanceBatch(ctx, tx, k, tok, position, position, func(bt *pgx.Batch) error {
					bt.Queue(merge)
					return nil
				}); err != nil {
					return err
				}
				return tx.Commit(ctx)
			}},
		}
		for _, sh := range shapes {
			for _, v := range []struct {
				name string
				run  func(int64) error
			}{{"unfenced", sh.unfenced}, {"fenced", sh.fenced}} {
				b.Run(fmt.Sprintf("rows=%d/%s/%s", n, sh.name, v.name), func(b *testing.B) {
					var iter int64
					for b.Loop() {
						iter++
						if err := v.run(iter); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
				})
			}
			// paired alternates the two variants iteration by iteration (in alternating
			// order), so load from other processes on a shared machine hits both alike. Its
			// fenced/unfenced metric is the median over pairs of the ratio of their rates:
			// neighbouring runs see the same load, and a median ignores the pairs a load
			// spike split.
			b.Run(fmt.Sprintf("rows=%d/%s/paired", n, sh.name), func(b *testing.B) {
				var iter int64
				var spent [2]time.Duration // unfenced, fenced
				var ratios []float64
				for b.Loop() {
					iter++
					order := [2]int{0, 1}
					if iter%2 == 0 {
						order = [2]int{1, 0}
					}
					var took [2]time.Duration
					for _, which := range order {
						run := sh.unfenced
						if which == 1 {
							run = sh.fenced
						}
						start := time.Now()
						if err := run(iter); err != nil {
							b.Fatal(err)
						}
						took[which] = time.Since(start)
					}
					spent[0] += took[0]
					spent[1] += took[1]
					ratios = append(ratios, took[0].Seconds()/took[1].Seconds())
				}
				rows := float64(n) * float64(b.N)
				slices.Sort(ratios)
				b.ReportMetric(rows/spent[0].Seconds(), "unfenced-rows/s")
				b.ReportMetric(rows/spent[1].Seconds(), "fenced-rows/s")
				b.ReportMetric(ratios[len(ratios)/2], "fenced/unfenced")
			})
		}
	}
}
