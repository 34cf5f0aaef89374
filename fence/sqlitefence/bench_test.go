package sqlitefence

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/batonhq/baton/fence"
)

// BenchmarkUpsert compares a batch of upserts committed in one transaction with and without the
// fence: "unfenced" is BEGIN IMMEDIATE, the upserts, COMMIT; "fenced" is Apply, which adds the
// conditional UPDATE of the fence row to the same transaction. Both rewrite the same rows, so
// the difference is the fence's cost. Run per durability setting (sync=FULL is the default).
func BenchmarkUpsert(b *testing.B) {
	for _, sync := range []Synchronous{SyncFull, SyncNormal} {
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

func benchUpsert(b *testing.B, sync Synchronous, n int, fenced bool) {
	s, err := Open(filepath.Join(b.TempDir(), "bench.db"), Sync(sync))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if _, err := s.DB().Exec(`CREATE TABLE kv (k TEXT PRIMARY KEY, v INTEGER NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	upsert := func(ctx context.Context, tx *sql.Tx, v int) error {
		st, err := tx.PrepareContext(ctx, `INSERT INTO kv (k, v) VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v`)
		if err != nil {
			return err
		}
		defer st.Close()
		for _, k := range keys {
			if _, err := st.ExecContext(ctx, k, v); err != nil {
				return err
			}
		}
		return nil
	}
	k := fence.Key{Group: "bench", Topic: "t", Partition: 0}
	t := fence.Token{Epoch: 1}
	if _, err := s.Claim(ctx, k, t); err != nil {
		b.Fatal(err)
	}

	for i := 0; b.Loop(); i++ {
		if fenced {
			err = s.Apply(ctx, k, t, int64(i), func(ctx context.Context, tx *sql.Tx) error { return upsert(ctx, tx, i) })
		} else {
			err = func() error {
				tx, err := s.DB().BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback()
				if err := upsert(ctx, tx, i); err != nil {
					return err
				}
				return tx.Commit()
			}()
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "rows/s")
}
