package pgbulk_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/fence/pgfence/pgbulk"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/jackc/pgx/v5"
)

// The fold the tests write: per key, how many records, their sum, the first and last value,
// and how many records did not follow the previous one (value = previous + 1): an order
// violation or a lost or doubled record shows in n, total or bad.
var foldCols = []pgbulk.Column{
	{Name: "key", Type: "text"}, {Name: "n", Type: "bigint"}, {Name: "total", Type: "bigint"},
	{Name: "first", Type: "bigint"}, {Name: "last", Type: "bigint"}, {Name: "bad", Type: "bigint"},
}

const foldSet = `n = t.n + excluded.n, total = t.total + excluded.total, last = excluded.last,
	bad = t.bad + excluded.bad + (excluded.first <> t.last + 1)::int`

func foldRow(key string, v int64) []any { return []any{key, int64(1), v, v, v, int64(0)} }

func mergeFold(into, row []any) {
	into[1] = into[1].(int64) + row[1].(int64)
	into[2] = into[2].(int64) + row[2].(int64)
	if row[3].(int64) != into[4].(int64)+1 {
		into[5] = into[5].(int64) + 1
	}
	into[5] = into[5].(int64) + row[5].(int64)
	into[4] = row[4]
}

func TestNewUpsertReportsEveryProblem(t *testing.T) {
	_, err := pgbulk.NewUpsert("bad name;", []string{"missing"},
		[]pgbulk.Column{{Name: "k", Type: "text; drop"}, {Name: "k", Type: "text"}, {Name: "", Type: "int"}},
		"", nil, pgbulk.RowsPerStatement(0), pgbulk.Merge(nil))
	if err == nil {
		t.Fatal("NewUpsert accepted an invalid upsert")
	}
	for _, want := range []string{"table", `invalid type "text; drop"`, `"k" listed twice`, `column 2: invalid name`,
		`key column "missing"`, "option 0 is nil", "RowsPerStatement(0)", "Merge: nil"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
}

func TestSQL(t *testing.T) {
	up, err := pgbulk.NewUpsert("app.kv", []string{"k"}, []pgbulk.Column{{Name: "k", Type: "text"}, {Name: "v", Type: "numeric(12,2)"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	want := `INSERT INTO "app"."kv" AS t ("k", "v") SELECT * FROM unnest($1::text[], $2::numeric(12,2)[]) ON CONFLICT ("k") DO UPDATE SET "v" = excluded."v"`
	if got := pgbulk.SQL(up); got != want {
		t.Errorf("SQL:\n got %s\nwant %s", got, want)
	}
	only, err := pgbulk.NewUpsert("kv", []string{"k"}, []pgbulk.Column{{Name: "k", Type: "text"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(pgbulk.SQL(only), "DO NOTHING") {
		t.Errorf("key-only upsert: %s", pgbulk.SQL(only))
	}
}

func TestQueueSplitsStatements(t *testing.T) {
	layered, err := pgbulk.NewUpsert("kv", []string{"key"}, foldCols, foldSet, pgbulk.RowsPerStatement(2))
	if err != nil {
		t.Fatal(err)
	}
	merged, err := pgbulk.NewUpsert("kv", []string{"key"}, foldCols, foldSet, pgbulk.RowsPerStatement(2), pgbulk.Merge(mergeFold))
	if err != nil {
		t.Fatal(err)
	}
	// a a a b c d e: layers {a b c d e} {a} {a} -> 3+1+1 statements of <= 2 rows; merged
	// {a b c d e} -> 3 statements.
	var rows [][]any
	for i, k := range []string{"a", "a", "a", "b", "c", "d", "e"} {
		rows = append(rows, foldRow(k, int64(i)))
	}
	for _, tc := range []struct {
		name string
		up   *pgbulk.Upsert
		want int
	}{{"layered", layered, 5}, {"merged", merged, 3}} {
		var b pgx.Batch
		if err := pgbulk.Queue(tc.up, &b, rows); err != nil {
			t.Fatal(err)
		}
		if b.Len() != tc.want {
			t.Errorf("%s: %d statements, want %d", tc.name, b.Len(), tc.want)
		}
	}
	if rows[0][1] != int64(1) {
		t.Errorf("Merge modified the caller's row: %v", rows[0])
	}
	var b pgx.Batch
	if err := pgbulk.Queue(merged, &b, [][]any{foldRow("a", 1), {"short"}}); err == nil || b.Len() != 0 {
		t.Errorf("a short row: err %v, %d statements queued", err, b.Len())
	}
}

// TestExecFoldsLikeRowByRow writes the same random records three ways (one upsert per
// record, merged, layered) into three tables and requires identical, exact folds.
func TestExecFoldsLikeRowByRow(t *testing.T) {
	pool, _ := testenv.Postgres(t)
	ctx := testenv.Context(t, 30*time.Second)
	const keys, perKey = 37, 60
	var rows [][]any
	next := make([]int64, keys)
	rng := rand.New(rand.NewPCG(1, 2))
	for range keys * perKey {
		k := rng.IntN(keys)
		for next[k] == perKey { // every key gets exactly perKey records, in order
			k = (k + 1) % keys
		}
		next[k]++
		rows = append(rows, foldRow(fmt.Sprintf("k%02d", k), next[k]))
	}
	for _, table := range []string{"rowwise", "merged", "layered"} {
		if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (key text PRIMARY KEY, n bigint, total bigint, first bigint, last bigint, bad bigint)`); err != nil {
			t.Fatal(err)
		}
	}
	one, err := pgbulk.NewUpsert("rowwise", []string{"key"}, foldCols, foldSet)
	if err != nil {
		t.Fatal(err)
	}
	merged, err := pgbulk.NewUpsert("merged", []string{"key"}, foldCols, foldSet, pgbulk.Merge(mergeFold), pgbulk.RowsPerStatement(10))
	if err != nil {
		t.Fatal(err)
	}
	layered, err := pgbulk.NewUpsert("layered", []string{"key"}, foldCols, foldSet, pgbulk.RowsPerStatement(10))
	if err != nil {
		t.Fatal(err)
	}
	// Apply in chunks of 250 rows, one transaction each, as a consumer's batches would.
	for start := 0; start < len(rows); start += 250 {
		chunk := rows[start:min(start+250, len(rows))]
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for _, r := range chunk {
				if err := one.Exec(ctx, tx, [][]any{r}); err != nil {
					return err
				}
			}
			if err := merged.Exec(ctx, tx, chunk); err != nil {
				return err
			}
			return layered.Exec(ctx, tx, chunk)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, table := range []string{"rowwise", "merged", "layered"} {
		var n, bad int
		err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE n <> $1 OR total <> $1 * ($1 + 1) / 2
			OR first <> 1 OR last <> $1 OR bad <> 0) FROM `+table, perKey).Scan(&n, &bad)
		if err != nil {
			t.Fatal(err)
		}
		if n != keys || bad != 0 {
			t.Errorf("%s: %d keys (want %d), %d with a wrong fold", table, n, keys, bad)
		}
	}
	// The checker itself can fail: one record out of order shows as bad.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return merged.Exec(ctx, tx, [][]any{foldRow("k00", perKey+2)})
	})
	if err != nil {
		t.Fatal(err)
	}
	var bad int64
	if err := pool.QueryRow(ctx, `SELECT bad FROM merged WHERE key = 'k00'`).Scan(&bad); err != nil || bad != 1 {
		t.Errorf("a skipped value: bad = %d (%v), want 1", bad, err)
	}
}

// TestQueueBesideTheFence queues the upsert after pgfence's fence statement: the rows commit
// with the fence advance, and a stale token's rows roll back with it.
func TestQueueBesideTheFence(t *testing.T) {
	pool, _ := testenv.Postgres(t)
	ctx := testenv.Context(t, 30*time.Second)
	s, err := pgfence.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE kv (key text PRIMARY KEY, n bigint, total bigint, first bigint, last bigint, bad bigint)`); err != nil {
		t.Fatal(err)
	}
	up, err := pgbulk.NewUpsert("kv", []string{"key"}, foldCols, foldSet, pgbulk.Merge(mergeFold))
	if err != nil {
		t.Fatal(err)
	}
	k := fence.Key{Group: "g", Topic: "t", Partition: 0}
	old, cur := fence.Token{Epoch: 1}, fence.Token{Epoch: 2}
	if _, err := s.Claim(ctx, k, cur, "test"); err != nil {
		t.Fatal(err)
	}
	write := func(tok fence.Token, pos int64, v int64) error {
		return s.ApplyBatch(ctx, k, tok, pos, pos, func(b *pgx.Batch) error {
			return pgbulk.Queue(up, b, [][]any{foldRow("a", v), foldRow("a", v+1)})
		})
	}
	if err := write(cur, 10, 1); err != nil {
		t.Fatal(err)
	}
	if err := write(old, 20, 3); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale token: %v, want ErrStale", err)
	}
	var n, last int64
	if err := pool.QueryRow(ctx, `SELECT n, last FROM kv WHERE key = 'a'`).Scan(&n, &last); err != nil {
		t.Fatal(err)
	}
	if n != 2 || last != 2 {
		t.Errorf("after a committed and a refused batch: n=%d last=%d, want 2 and 2", n, last)
	}
}

// BenchmarkQueue measures what Exec does before it sends: a batch as 'baton bench' writes it
// (1000 rows of six values over 83 string keys, merged per key) split, merged and turned into
// column arrays. Read its allocs/op and B/op.
//
//	go test -run '^$' -bench Queue -benchmem ./fence/pgfence/pgbulk/
func BenchmarkQueue(b *testing.B) {
	cols := []pgbulk.Column{{Name: "key", Type: "text"}, {Name: "n", Type: "bigint"}, {Name: "total", Type: "bigint"},
		{Name: "first", Type: "bigint"}, {Name: "last", Type: "bigint"}, {Name: "bad", Type: "bigint"}}
	up, err := pgbulk.NewUpsert("fold", []string{"key"}, cols, "n = t.n + excluded.n", pgbulk.Merge(func(into, row []any) {
		into[1] = into[1].(int64) + row[1].(int64)
		into[4] = row[4]
	}))
	if err != nil {
		b.Fatal(err)
	}
	rows := make([][]any, 1000)
	for i := range rows {
		v := int64(i/83 + 1)
		rows[i] = []any{fmt.Sprintf("k%05d", i%83*12), int64(1), v, v, v, int64(0)}
	}
	for b.Loop() {
		var bt pgx.Batch
		if err := pgbulk.Queue(up, &bt, rows); err != nil || bt.Len() != 1 {
			b.Fatalf("%d statements, %v", bt.Len(), err)
		}
	}
}
