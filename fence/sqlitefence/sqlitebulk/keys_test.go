package sqlitebulk_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence/sqlitefence/sqlitebulk"
)

// typed formats values with their Go types: int(7) int64(7).
func typed(vs []any) string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = fmt.Sprintf("%T(%v)", v, v)
	}
	return strings.Join(out, " ")
}

func keyRow(key any, v int64) []any { return []any{key, int64(1), v, v, v, int64(0)} }

func exec(ctx context.Context, db *sql.DB, up *sqlitebulk.Upsert, rows [][]any) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := up.Exec(ctx, tx, rows); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// TestKeysOfOneIntegerInEveryWidthAreOneKey: int, int32, int64 and the other widths of one
// integer are one key: merged, merge is called for each repeat; layered, each repeat is a
// statement of its own; either way the fold is exact and in record order.
func TestKeysOfOneIntegerInEveryWidthAreOneKey(t *testing.T) {
	s := open(t)
	ctx := t.Context()
	keys := []any{int(7), int32(7), int64(7), uint8(7), int16(7), uint(7)}
	var rows [][]any
	for i, k := range keys {
		rows = append(rows, keyRow(k, int64(i+1)))
	}
	for _, merged := range []bool{true, false} {
		table := map[bool]string{true: "merged", false: "layered"}[merged]
		if _, err := s.DB().ExecContext(ctx, `CREATE TABLE `+table+` (key INTEGER PRIMARY KEY, n INTEGER, total INTEGER, first INTEGER, last INTEGER, bad INTEGER)`); err != nil {
			t.Fatal(err)
		}
		merges := 0
		var opts []sqlitebulk.Option
		if merged {
			opts = append(opts, sqlitebulk.Merge(func(into, row []any) { merges++; mergeFold(into, row) }))
		}
		up, err := sqlitebulk.NewUpsert(table, []string{"key"}, foldCols, foldSet, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if n := sqlitebulk.Statements(up, rows); n != map[bool]int{true: 1, false: len(rows)}[merged] {
			t.Errorf("%s: keys %s held as different keys: %d statements", table, typed(keys), n)
		}
		merges = 0
		if err := exec(ctx, s.DB(), up, rows); err != nil {
			t.Errorf("%s: keys %s held as different keys: %v", table, typed(keys), err)
			continue
		}
		if merged && merges != len(rows)-1 {
			t.Errorf("%s: keys %s held as different keys: merge called %d times, want %d", table, typed(keys), merges, len(rows)-1)
		}
		if n, bad := check(t, s.DB(), table, int64(len(rows))); n != 1 || bad != 0 {
			t.Errorf("%s: %d keys, %d wrong, want one key folded in order", table, n, bad)
		}
	}
}

// TestKeysEqualOnlyUnderTheDatabasesEqualityAreRefused: keys Go cannot know to be equal (a
// COLLATE NOCASE column, numeric affinity) reach one statement; SQLite would apply both rows
// in an order it does not document, so Exec refuses the statement with a permanent
// error naming the table and the key, and the caller rolls back. Instants in two
// zones are two keys: the driver stores each with its zone.
func TestKeysEqualOnlyUnderTheDatabasesEqualityAreRefused(t *testing.T) {
	s := open(t)
	ctx := t.Context()
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name, colType string
		keys          []any
		want          string // the key named, or "" if the rows are two keys
	}{
		{"case_variants", "TEXT COLLATE NOCASE", []any{"Seven", "seven"}, `('Seven')`},
		{"numeric_values", "NUMERIC", []any{int64(1), 1.0}, `(1)`},
		{"numeric_text", "NUMERIC", []any{"1", "1.0"}, `(1)`},
		{"instant_in_two_zones", "TEXT", []any{at, at.In(time.FixedZone("+02", 2*3600))}, ""},
	} {
		if _, err := s.DB().ExecContext(ctx, `CREATE TABLE `+tc.name+` (key `+tc.colType+` PRIMARY KEY, n INTEGER, total INTEGER, first INTEGER, last INTEGER, bad INTEGER)`); err != nil {
			t.Fatal(err)
		}
		for _, opts := range [][]sqlitebulk.Option{{sqlitebulk.Merge(mergeFold)}, nil} {
			up, err := sqlitebulk.NewUpsert(tc.name, []string{"key"}, foldCols, foldSet, opts...)
			if err != nil {
				t.Fatal(err)
			}
			err = exec(ctx, s.DB(), up, [][]any{keyRow(tc.keys[0], 1), keyRow(tc.keys[1], 2)})
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("%s: %v", tc.name, err)
			case tc.want == "":
			case err == nil:
				t.Errorf("%s: keys %#v written in one statement without an error", tc.name, tc.keys)
			case !consumer.IsPermanent(err):
				t.Errorf("%s: %v: want a permanent error", tc.name, err)
			case !strings.Contains(err.Error(), `"`+tc.name+`"`) || !strings.Contains(err.Error(), tc.want):
				t.Errorf("%s: %v: want the table %q and the key %s named", tc.name, err, tc.name, tc.want)
			}
		}
		var count int
		if err := s.DB().QueryRowContext(ctx, `SELECT count(*) FROM `+tc.name).Scan(&count); err != nil {
			t.Fatal(err)
		}
		if want := map[bool]int{true: 2, false: 0}[tc.want == ""]; count != want {
			t.Errorf("%s: %d rows, want %d", tc.name, count, want)
		}
	}
}
