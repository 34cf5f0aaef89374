package sqlitebulk_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/fence/sqlitefence/sqlitebulk"
)

// BenchmarkFoldPaired folds batches of records (100 keys, each batch holding every key
// batch/100 times) into SQLite three ways, alternating within one benchmark so that load from
// other processes falls on all alike: "fenced" is sqlitefence's Apply around the fast path
// (the fence's conditional UPDATE, then the merged upsert, one transaction), "unfenced" the
// same upsert in a plain transaction (BEGIN IMMEDIATE, upsert, COMMIT), "rowwise" the fenced
// transaction with one prepared upsert per record (the handler shape of the docs). It reports
// each one's records/s (over the sums of their times) and the ratios fenced/unfenced and
// fenced/rowwise (medians of the ratios within an iteration).
func BenchmarkFoldPaired(b *testing.B) {
	for _, sync := range []string{"FULL", "NORMAL"} {
		for _, n := range []int{100, 1000, 5000} {
			b.Run(fmt.Sprintf("sync=%s/batch=%d", sync, n), func(b *testing.B) { benchFold(b, sync, n) })
		}
	}
}

func benchFold(b *testing.B, sync string, n int) {
	ctx := context.Background()
	s, err := sqlitefence.Open(filepath.Join(b.TempDir(), "bench.db"), syncOptions(sync)...)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for _, table := range []string{"fenced", "unfenced", "rowwise"} {
		if _, err := s.DB().ExecContext(ctx, `CREATE TABLE `+table+foldTable); err != nil {
			b.Fatal(err)
		}
	}
	ups := map[string]*sqlitebulk.Upsert{}
	for _, table := range []string{"fenced", "unfenced"} {
		if ups[table], err = sqlitebulk.NewUpsert(table, []string{"key"}, foldCols, foldSet, sqlitebulk.Merge(mergeFold)); err != nil {
			b.Fatal(err)
		}
		if err := ups[table].Prepare(ctx, s.DB()); err != nil {
			b.Fatal(err)
		}
		defer ups[table].Close()
	}
	k, k2, tok := fence.Key{Group: "bench", Topic: "t", Partition: 0}, fence.Key{Group: "bench", Topic: "t", Partition: 1}, fence.Token{Epoch: 1}
	for _, k := range []fence.Key{k, k2} {
		if _, err := s.Claim(ctx, k, tok, "bench"); err != nil {
			b.Fatal(err)
		}
	}
	const keys = 100
	var seq int64 // values per key: batch i carries values seq+1 .. seq+n/keys of every key
	batch := func() [][]any {
		rows := make([][]any, 0, n)
		per := max(n/keys, 1)
		for j := range per {
			for key := range min(keys, n) {
				rows = append(rows, foldRow(fmt.Sprintf("k%03d", key), seq+int64(j)+1))
			}
		}
		seq += int64(per)
		return rows
	}
	var spent [3]time.Duration
	var vsUnfenced, vsRowwise []float64 // per iteration: the paired ratios
	var pos, pos2 int64
	for i := 0; b.Loop(); i++ {
		rows := batch()
		var took [3]time.Duration
		for j := range 3 {
			which := (i + j) % 3 // rotate the order
			start := time.Now()
			var err error
			switch which {
			case 0:
				pos += int64(len(rows))
				err = s.Apply(ctx, k, tok, pos-int64(len(rows))+1, pos, func(ctx context.Context, tx *sql.Tx) error {
					return ups["fenced"].Exec(ctx, tx, rows)
				})
			case 1:
				err = plainTx(ctx, s.DB(), func(tx *sql.Tx) error { return ups["unfenced"].Exec(ctx, tx, rows) })
			case 2:
				pos2 += int64(len(rows))
				err = s.Apply(ctx, k2, tok, pos2-int64(len(rows))+1, pos2, func(ctx context.Context, tx *sql.Tx) error {
					st, err := tx.PrepareContext(ctx, `INSERT INTO rowwise AS t (key, n, total, first, last, bad) VALUES (?, ?, ?, ?, ?, ?)
						ON CONFLICT (key) DO UPDATE SET `+foldSet)
					if err != nil {
						return err
					}
					defer st.Close()
					for _, r := range rows {
						if _, err := st.ExecContext(ctx, r...); err != nil {
							return err
						}
					}
					return nil
				})
			}
			if err != nil {
				b.Fatal(err)
			}
			took[which] = time.Since(start)
			spent[which] += took[which]
		}
		vsUnfenced = append(vsUnfenced, took[1].Seconds()/took[0].Seconds())
		vsRowwise = append(vsRowwise, took[2].Seconds()/took[0].Seconds())
	}
	recs := float64(n * b.N)
	b.ReportMetric(recs/spent[0].Seconds(), "fenced-rec/s")
	b.ReportMetric(recs/spent[1].Seconds(), "unfenced-rec/s")
	b.ReportMetric(recs/spent[2].Seconds(), "rowwise-rec/s")
	// Medians of the per-iteration ratios: a scheduler stall of one transaction on a loaded
	// machine moves a sum, not a median.
	b.ReportMetric(median(vsUnfenced), "fenced/unfenced")
	b.ReportMetric(median(vsRowwise), "fenced/rowwise")
	for _, table := range []string{"fenced", "unfenced", "rowwise"} {
		if n, bad := checkB(b, s.DB(), table, seq); n != keys || bad != 0 {
			b.Fatalf("%s: %d keys, %d wrong", table, n, bad)
		}
	}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return v[len(v)/2]
}

func plainTx(ctx context.Context, db *sql.DB, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

func checkB(b *testing.B, db *sql.DB, table string, perKey int64) (n, bad int) {
	b.Helper()
	err := db.QueryRow(`SELECT count(*), count(*) FILTER (WHERE n <> ?1 OR total <> ?1 * (?1 + 1) / 2
		OR first <> 1 OR last <> ?1 OR bad <> 0) FROM `+table, perKey).Scan(&n, &bad)
	if err != nil {
		b.Fatal(err)
	}
	return n, bad
}

// syncOptions returns the options that open a store with PRAGMA synchronous=sync.
func syncOptions(sync string) []sqlitefence.Option {
	if sync == "NORMAL" {
		return []sqlitefence.Option{sqlitefence.SyncNormal()}
	}
	return nil
}
