package sqlitefence

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/batonhq/baton/fence"
)

// BenchmarkUpsert compares a batch of upserts committed in one transaction with and without the
// fence: "unfenced" is BEGIN IMMEDIATE, the upserts, COMMIT; "fenced" is Apply, which adds the
// conditional UPDATE of the fence row to the same transaction. Both rewrite the same rows, so
// the difference is the fence's cost. Run per durability setting (sync=FULL is the default).
func BenchmarkUpsert(b *testing.B) {
	for _, sync := range []string{"FULL", "NORMAL"} {
		for _, n := range []int{1, 10, 100, 1000} {
			for _, fenced := range []bool{false, true} {
				name := fmt.Sprintf("sync=%s/batch=%d/unfenced", sync, n)
				if fenced {
					name = fmt.Sprintf("sync=%s/batch=%d/fenced", sync, n)
				}
				b.Run(name, func(b *testing.B) { benchUpsert(b, sync, n, fenced) })
			}
		}
	}
}

// benchEnv is a store on a fresh file with a user table of n rows to rewrite.
type benchEnv struct {
	s    *Store
	keys []string
	k    fence.Key
	t    fence.Token
}

func newBenchEnv(b *testing.B, sync string, n int) *benchEnv {
	s, err := Open(filepath.Join(b.TempDir(), "bench.db"), syncOptions(sync)...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	if _, err := s.DB().Exec(`CREATE TABLE kv (k TEXT PRIMARY KEY, v INTEGER NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	e := &benchEnv{s: s, k: fence.Key{Group: "bench", Topic: "t", Partition: 0}, t: fence.Token{Epoch: 1}}
	for i := range n {
		e.keys = append(e.keys, "key-"+strconv.Itoa(i))
	}
	if _, err := s.Claim(context.Background(), e.k, e.t, "fencetest"); err != nil {
		b.Fatal(err)
	}
	return e
}

// upsert writes every row with value v, through one prepared statement.
func (e *benchEnv) upsert(ctx context.Context, tx *sql.Tx, v int) error {
	st, err := tx.PrepareContext(ctx, `INSERT INTO kv (k, v) VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v`)
	if err != nil {
		return err
	}
	defer st.Close()
	for _, k := range e.keys {
		if _, err := st.ExecContext(ctx, k, v); err != nil {
			return err
		}
	}
	return nil
}

// unfenced commits one batch in a plain transaction (BEGIN IMMEDIATE, as Open configures).
func (e *benchEnv) unfenced(ctx context.Context, v int) error {
	tx, err := e.s.DB().BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := e.upsert(ctx, tx, v); err != nil {
		return err
	}
	return tx.Commit()
}

// fenced commits one batch through Apply at position pos.
func (e *benchEnv) fenced(ctx context.Context, pos int64, v int) error {
	return e.s.Apply(ctx, e.k, e.t, pos, pos, func(ctx context.Context, tx *sql.Tx) error { return e.upsert(ctx, tx, v) })
}

func benchUpsert(b *testing.B, sync string, n int, fenced bool) {
	e := newBenchEnv(b, sync, n)
	ctx := context.Background()
	var err error
	for i := 0; b.Loop(); i++ {
		if fenced {
			err = e.fenced(ctx, int64(i), i)
		} else {
			err = e.unfenced(ctx, i)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "rows/s")
}

// BenchmarkUpsertPaired runs the same comparison with the two kinds of transaction alternating
// on one file within one benchmark (order swapped every iteration), timing each kind apart.
// Load from other processes then falls on both alike, so the fenced/unfenced ratio it reports
// is steadier than the ratio of two separate runs on a shared machine.
func BenchmarkUpsertPaired(b *testing.B) {
	for _, sync := range []string{"FULL", "NORMAL"} {
		for _, n := range []int{1, 10, 100, 1000} {
			b.Run(fmt.Sprintf("sync=%s/batch=%d", sync, n), func(b *testing.B) {
				e := newBenchEnv(b, sync, n)
				ctx := context.Background()
				var tFenced, tUnfenced time.Duration
				for i := 0; b.Loop(); i++ {
					for j := range 2 {
						start := time.Now()
						// Distinct values: SQLite skips a page write when a row is rewritten
						// unchanged, which would make the second transaction of a pair free.
						if (i+j)%2 == 0 {
							if err := e.fenced(ctx, int64(i), 2*i); err != nil {
								b.Fatal(err)
							}
							tFenced += time.Since(start)
						} else {
							if err := e.unfenced(ctx, 2*i+1); err != nil {
								b.Fatal(err)
							}
							tUnfenced += time.Since(start)
						}
					}
				}
				rows := float64(n * b.N)
				b.ReportMetric(rows/tUnfenced.Seconds(), "unfenced-rows/s")
				b.ReportMetric(rows/tFenced.Seconds(), "fenced-rows/s")
				b.ReportMetric(tUnfenced.Seconds()/tFenced.Seconds(), "fenced/unfenced")
			})
		}
	}
}

// syncOptions returns the options that open a store with PRAGMA synchronous=sync.
func syncOptions(sync string) []Option {
	if sync == "NORMAL" {
		return []Option{SyncNormal()}
	}
	return nil
}
