package sqlitebulk_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/fence/sqlitefence/sqlitebulk"
)

// The fold the tests write: per key, how many records, their sum, the first and last value,
// and how many records did not follow the previous one (value = previous + 1): an order
// violation or a lost or doubled record shows in n, total or bad.
var foldCols = []sqlitebulk.Column{{Name: "key"}, {Name: "n"}, {Name: "total"}, {Name: "first"}, {Name: "last"}, {Name: "bad"}}

const foldSet = `n = t.n + excluded.n, total = t.total + excluded.total, last = excluded.last,
	bad = t.bad + excluded.bad + (excluded.first <> t.last + 1)`

const foldTable = ` (key TEXT PRIMARY KEY, n INTEGER, total INTEGER, first INTEGER, last INTEGER, bad INTEGER)`

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

func open(t *testing.T) *sqlitefence.Store {
	t.Helper()
	s, err := sqlitefence.Open(filepath.Join(t.TempDir(), "bulk.db"), sqlitefence.SyncNormal())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestNewUpsertReportsEveryProblem(t *testing.T) {
	_, err := sqlitebulk.NewUpsert("bad name;", []string{"missing"},
		[]sqlitebulk.Column{{Name: "k", Type: "text; drop"}, {Name: "k"}, {Name: ""}},
		"", nil, sqlitebulk.RowsPerStatement(0), sqlitebulk.Merge(nil))
	if err == nil {
		t.Fatal("NewUpsert accepted an invalid upsert")
	}
	for _, want := range []string{"table", `invalid type "text; drop"`, `"k" listed twice`, `column 2: invalid name`,
		`key column "missing"`, "option 0 is nil", "RowsPerStatement(0)", "Merge: nil"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q:\n%v", want, err)
		}
	}
	wide := make([]sqlitebulk.Column, 40)
	for i := range wide {
		wide[i].Name = fmt.Sprintf("c%d", i)
	}
	if _, err := sqlitebulk.NewUpsert("w", []string{"c0"}, wide, "", sqlitebulk.RowsPerStatement(1000)); err == nil || !strings.Contains(err.Error(), "binds 40000 values") {
		t.Errorf("1000 rows of 40 columns: %v, want refused", err)
	}
	up, err := sqlitebulk.NewUpsert("w", []string{"c0"}, wide, "")
	if err != nil {
		t.Fatal(err)
	}
	rows := make([][]any, 1000)
	for i := range rows {
		rows[i] = make([]any, 40)
		rows[i][0] = i
	}
	if n := sqlitebulk.Statements(up, rows); n != 2 { // 819 rows of 40 columns fit 32766 variables
		t.Errorf("1000 rows of 40 columns by default: %d statements, want 2", n)
	}
}

func TestSQL(t *testing.T) {
	up, err := sqlitebulk.NewUpsert("app.kv", []string{"k"}, []sqlitebulk.Column{{Name: "k", Type: "TEXT"}, {Name: "v"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	want := `INSERT INTO "app"."kv" AS t ("k", "v") VALUES (CAST(? AS TEXT), ?), (CAST(? AS TEXT), ?) ON CONFLICT ("k") DO UPDATE SET "v" = excluded."v"` +
		` RETURNING CASE WHEN "k" IS NULL THEN NULL ELSE quote("k") END`
	if got := sqlitebulk.SQL(up, 2); got != want {
		t.Errorf("SQL:\n got %s\nwant %s", got, want)
	}
	only, err := sqlitebulk.NewUpsert("kv", []string{"k"}, []sqlitebulk.Column{{Name: "k"}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(sqlitebulk.SQL(only, 1), "DO NOTHING") {
		t.Errorf("key-only upsert: %s", sqlitebulk.SQL(only, 1))
	}
}

func TestStatements(t *testing.T) {
	layered, err := sqlitebulk.NewUpsert("kv", []string{"key"}, foldCols, foldSet, sqlitebulk.RowsPerStatement(2))
	if err != nil {
		t.Fatal(err)
	}
	merged, err := sqlitebulk.NewUpsert("kv", []string{"key"}, foldCols, foldSet, sqlitebulk.RowsPerStatement(2), sqlitebulk.Merge(mergeFold))
	if err != nil {
		t.Fatal(err)
	}
	// a a a b c d e: layers {a b c d e} {a} {a} -> 3+1+1 statements of <= 2 rows; merged
	// {a b c d e} -> 3 statements.
	var rows [][]any
	for i, k := range []string{"a", "a", "a", "b", "c", "d", "e"} {
		rows = append(rows, foldRow(k, int64(i)))
	}
	if n := sqlitebulk.Statements(layered, rows); n != 5 {
		t.Errorf("layered: %d statements, want 5", n)
	}
	if n := sqlitebulk.Statements(merged, rows); n != 3 {
		t.Errorf("merged: %d statements, want 3", n)
	}
	// Prepared, a remainder is written as one statement per set bit: 5 rows of at most 4 a
	// statement -> 4 + 1; 7 -> 4 + 2 + 1.
	s := open(t)
	by4, err := sqlitebulk.NewUpsert("kv", []string{"key"}, foldCols, foldSet, sqlitebulk.RowsPerStatement(4))
	if err != nil {
		t.Fatal(err)
	}
	if err := by4.Prepare(t.Context(), s.DB()); err == nil {
		t.Error("Prepare succeeded without the table")
	}
	if _, err := s.DB().Exec(`CREATE TABLE kv` + foldTable); err != nil {
		t.Fatal(err)
	}
	if err := by4.Prepare(t.Context(), s.DB()); err != nil {
		t.Fatal(err)
	}
	defer by4.Close()
	if n := sqlitebulk.Statements(by4, rows[2:]); n != 2 {
		t.Errorf("5 distinct keys, prepared by 4: %d statements, want 2", n)
	}
	seven := [][]any{foldRow("a", 1), foldRow("b", 1), foldRow("c", 1), foldRow("d", 1), foldRow("e", 1), foldRow("f", 1), foldRow("g", 1)}
	if n := sqlitebulk.Statements(by4, seven); n != 3 {
		t.Errorf("7 distinct keys, prepared by 4: %d statements, want 3", n)
	}
	if err := by4.Exec(t.Context(), s.DB(), seven); err != nil {
		t.Fatal(err)
	}
	if n, bad := check(t, s.DB(), "kv", 1); n != 7 || bad != 0 {
		t.Errorf("7 rows prepared: %d keys, %d wrong", n, bad)
	}
	if rows[0][1] != int64(1) {
		t.Errorf("Merge modified the caller's row: %v", rows[0])
	}
}

// TestExecFoldsLikeRowByRow writes the same random records three ways (one upsert per
// record, merged, layered) into three tables, in batches applied through sqlitefence's Apply,
// and requires identical, exact folds. Every batch holds keys several times.
func TestExecFoldsLikeRowByRow(t *testing.T) {
	s := open(t)
	ctx := t.Context()
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
		if _, err := s.DB().ExecContext(ctx, `CREATE TABLE `+table+foldTable); err != nil {
			t.Fatal(err)
		}
	}
	one, err := sqlitebulk.NewUpsert("rowwise", []string{"key"}, foldCols, foldSet)
	if err != nil {
		t.Fatal(err)
	}
	merged, err := sqlitebulk.NewUpsert("merged", []string{"key"}, foldCols, foldSet, sqlitebulk.Merge(mergeFold), sqlitebulk.RowsPerStatement(10))
	if err != nil {
		t.Fatal(err)
	}
	layered, err := sqlitebulk.NewUpsert("layered", []string{"key"}, foldCols, foldSet, sqlitebulk.RowsPerStatement(10))
	if err != nil {
		t.Fatal(err)
	}
	// merged runs prepared statements (sizes 1, 2, 4, 8, 10), the others unprepared.
	if err := merged.Prepare(ctx, s.DB()); err != nil {
		t.Fatal(err)
	}
	defer merged.Close()
	k, tok := fence.Key{Group: "g", Topic: "t", Partition: 0}, fence.Token{Epoch: 1}
	if _, err := s.Claim(ctx, k, tok, "test"); err != nil {
		t.Fatal(err)
	}
	// Apply in chunks of 250 rows, one fenced transaction each, as a consumer's batches would.
	for start := 0; start < len(rows); start += 250 {
		chunk := rows[start:min(start+250, len(rows))]
		err := s.Apply(ctx, k, tok, int64(start), int64(start+len(chunk)-1), func(ctx context.Context, tx *sql.Tx) error {
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
		if n, bad := check(t, s.DB(), table, perKey); n != keys || bad != 0 {
			t.Errorf("%s: %d keys (want %d), %d with a wrong fold", table, n, keys, bad)
		}
	}
	// The checker itself can fail: one record out of order shows as bad.
	if err := merged.Exec(ctx, s.DB(), [][]any{foldRow("k00", perKey+2)}); err != nil {
		t.Fatal(err)
	}
	if _, bad := check(t, s.DB(), "merged", perKey); bad != 1 {
		t.Errorf("a skipped value: %d bad keys, want 1", bad)
	}
}

// TestSameKeyTwiceInABatch: one batch holding a key twice (and thrice) in one statement's
// worth of rows leaves the fold the records would one by one, merged or layered; merged, each
// key is written once (triggers count the row writes), layered, a key's k rows take k
// statements.
func TestSameKeyTwiceInABatch(t *testing.T) {
	s := open(t)
	ctx := t.Context()
	batch := [][]any{foldRow("a", 1), foldRow("b", 1), foldRow("a", 2), foldRow("a", 3), foldRow("b", 2)}
	if _, err := s.DB().ExecContext(ctx, `CREATE TABLE writes (tbl TEXT PRIMARY KEY, n INTEGER)`); err != nil {
		t.Fatal(err)
	}
	for name, opts := range map[string][]sqlitebulk.Option{"merged": {sqlitebulk.Merge(mergeFold)}, "layered": nil} {
		if _, err := s.DB().ExecContext(ctx, `CREATE TABLE `+name+foldTable); err != nil {
			t.Fatal(err)
		}
		for _, ev := range []string{"INSERT", "UPDATE"} {
			if _, err := s.DB().ExecContext(ctx, fmt.Sprintf(`CREATE TRIGGER %[1]s_%[2]s AFTER %[2]s ON %[1]s BEGIN
				INSERT INTO writes VALUES ('%[1]s', 1) ON CONFLICT (tbl) DO UPDATE SET n = n + 1; END`, name, ev)); err != nil {
				t.Fatal(err)
			}
		}
		up, err := sqlitebulk.NewUpsert(name, []string{"key"}, foldCols, foldSet, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if n := sqlitebulk.Statements(up, batch); (name == "merged") != (n == 1) {
			t.Errorf("%s: %d statements", name, n)
		}
		if err := up.Exec(ctx, s.DB(), batch); err != nil {
			t.Fatal(err)
		}
		for key, want := range map[string][5]int64{"a": {3, 6, 1, 3, 0}, "b": {2, 3, 1, 2, 0}} {
			var got [5]int64
			if err := s.DB().QueryRowContext(ctx, `SELECT n, total, first, last, bad FROM `+name+` WHERE key = ?`, key).
				Scan(&got[0], &got[1], &got[2], &got[3], &got[4]); err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("%s: key %s: n, total, first, last, bad = %v, want %v", name, key, got, want)
			}
		}
		var writes int
		if err := s.DB().QueryRowContext(ctx, `SELECT n FROM writes WHERE tbl = ?`, name).Scan(&writes); err != nil {
			t.Fatal(err)
		}
		if want := map[string]int{"merged": 2, "layered": 5}[name]; writes != want {
			t.Errorf("%s: %d row writes, want %d", name, writes, want)
		}
	}
}

// TestExecBesideTheFence: the rows commit with the fence advance, and a stale token's rows
// roll back with it.
func TestExecBesideTheFence(t *testing.T) {
	s := open(t)
	ctx := t.Context()
	if _, err := s.DB().ExecContext(ctx, `CREATE TABLE kv`+foldTable); err != nil {
		t.Fatal(err)
	}
	up, err := sqlitebulk.NewUpsert("kv", []string{"key"}, foldCols, foldSet, sqlitebulk.Merge(mergeFold))
	if err != nil {
		t.Fatal(err)
	}
	k := fence.Key{Group: "g", Topic: "t", Partition: 0}
	old, cur := fence.Token{Epoch: 1}, fence.Token{Epoch: 2}
	if _, err := s.Claim(ctx, k, cur, "test"); err != nil {
		t.Fatal(err)
	}
	write := func(tok fence.Token, pos int64, v int64) error {
		return s.Apply(ctx, k, tok, pos, pos, func(ctx context.Context, tx *sql.Tx) error {
			return up.Exec(ctx, tx, [][]any{foldRow("a", v), foldRow("a", v+1)})
		})
	}
	if err := write(cur, 10, 1); err != nil {
		t.Fatal(err)
	}
	if err := write(old, 20, 3); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale token: %v, want ErrStale", err)
	}
	var n, last int64
	if err := s.DB().QueryRowContext(ctx, `SELECT n, last FROM kv WHERE key = 'a'`).Scan(&n, &last); err != nil {
		t.Fatal(err)
	}
	if n != 2 || last != 2 {
		t.Errorf("after a committed and a refused batch: n=%d last=%d, want 2 and 2", n, last)
	}
	// A row of the wrong width writes nothing.
	if err := up.Exec(ctx, s.DB(), [][]any{foldRow("b", 1), {"short"}}); err == nil {
		t.Error("a short row was accepted")
	}
	var rows int
	if err := s.DB().QueryRowContext(ctx, `SELECT count(*) FROM kv`).Scan(&rows); err != nil || rows != 1 {
		t.Errorf("after a refused Exec: %d rows (%v), want 1", rows, err)
	}
}

func check(t *testing.T, db *sql.DB, table string, perKey int64) (n, bad int) {
	t.Helper()
	err := db.QueryRow(`SELECT count(*), count(*) FILTER (WHERE n <> ?1 OR total <> ?1 * (?1 + 1) / 2
		OR first <> 1 OR last <> ?1 OR bad <> 0) FROM `+table, perKey).Scan(&n, &bad)
	if err != nil {
		t.Fatal(err)
	}
	return n, bad
}
