package pgbulk_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/fence/pgfence/pgbulk"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// keyFold is the fold of the tests with a key column of type typ.
func keyFold(typ string) []pgbulk.Column {
	cols := append([]pgbulk.Column(nil), foldCols...)
	cols[0] = pgbulk.Column{Name: "key", Type: typ}
	return cols
}

func keyRow(key any, v int64) []any { return []any{key, int64(1), v, v, v, int64(0)} }

func foldTable(t *testing.T, ctx context.Context, pool *pgxpool.Pool, table, keyType string) {
	t.Helper()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (key `+keyType+` PRIMARY KEY, n bigint, total bigint, first bigint, last bigint, bad bigint)`); err != nil {
		t.Fatal(err)
	}
}

// TestKeysOneValueInTheDatabaseAreOneKey writes rows whose keys differ as Go values but
// are one value of the column's type (an integer of several widths, an instant in several
// zones, instants within one microsecond): merged or layered, they fold into one row in
// record order, as rows with equal Go keys do.
func TestKeysOneValueInTheDatabaseAreOneKey(t *testing.T) {
	pool, _ := testenv.Postgres(t)
	ctx := testenv.Context(t, 30*time.Second)
	at := time.Date(2026, 3, 1, 12, 0, 0, 1000, time.UTC)
	for _, tc := range []struct {
		name, typ string
		keys      []any
	}{
		{"integer widths", "bigint", []any{int(7), int32(7), int64(7), uint8(7), int16(7)}},
		{"integer widths in numeric", "numeric", []any{int(7), int64(7), uint32(7)}},
		{"one instant in two zones", "timestamptz", []any{at, at.In(time.FixedZone("+02", 2*3600)), at.Add(999), at.In(time.FixedZone("-07", -7*3600)).Add(500)}},
		{"one wall clock in two zones", "timestamp", []any{at, time.Date(2026, 3, 1, 12, 0, 0, 1999, time.FixedZone("+02", 2*3600))}},
		{"one day in two zones", "date", []any{at, time.Date(2026, 3, 1, 23, 0, 0, 0, time.FixedZone("-07", -7*3600))}},
	} {
		for _, merged := range []bool{true, false} {
			name := tc.name + map[bool]string{true: " merged", false: " layered"}[merged]
			table := strings.NewReplacer(" ", "_").Replace(name)
			foldTable(t, ctx, pool, table, tc.typ)
			merges := 0
			opts := []pgbulk.Option{}
			if merged {
				opts = append(opts, pgbulk.Merge(func(into, row []any) { merges++; mergeFold(into, row) }))
			}
			up, err := pgbulk.NewUpsert(table, []string{"key"}, keyFold(tc.typ), foldSet, opts...)
			if err != nil {
				t.Fatal(err)
			}
			var rows [][]any
			for i, k := range tc.keys {
				rows = append(rows, keyRow(k, int64(i+1)))
			}
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return up.Exec(ctx, tx, rows) }); err != nil {
				t.Errorf("%s: keys %v held as different keys: %v", name, tc.keys, err)
				continue
			}
			if merged && merges != len(rows)-1 {
				t.Errorf("%s: keys %v held as different keys: merge called %d times, want %d", name, tc.keys, merges, len(rows)-1)
			}
			var count, n, last, bad int64
			if err := pool.QueryRow(ctx, `SELECT count(*), sum(n), max(last), sum(bad) FROM `+table).Scan(&count, &n, &last, &bad); err != nil {
				t.Fatal(err)
			}
			if count != 1 || n != int64(len(rows)) || last != int64(len(rows)) || bad != 0 {
				t.Errorf("%s: %d rows, n=%d last=%d bad=%d; want one row folded in order", name, count, n, last, bad)
			}
		}
	}
}

// TestKeysTheDatabaseHoldsApartStayApart: Go values that are equal instants but different
// values of the column (a timestamp without time zone takes the wall clock) are two keys.
func TestKeysTheDatabaseHoldsApartStayApart(t *testing.T) {
	pool, _ := testenv.Postgres(t)
	ctx := testenv.Context(t, 30*time.Second)
	foldTable(t, ctx, pool, "walls", "timestamp")
	up, err := pgbulk.NewUpsert("walls", []string{"key"}, keyFold("timestamp"), foldSet, pgbulk.Merge(mergeFold))
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	rows := [][]any{keyRow(at, 1), keyRow(at.In(time.FixedZone("+02", 2*3600)), 1)}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return up.Exec(ctx, tx, rows) }); err != nil {
		t.Fatal(err)
	}
	var count int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM walls`).Scan(&count); err != nil || count != 2 {
		t.Errorf("one instant at two wall clocks in a timestamp column: %d rows (%v), want 2", count, err)
	}
}

// TestKeysEqualOnlyUnderTheDatabasesEqualityArePermanent: keys Go cannot know to be equal
// (a case-insensitive collation, numeric text) reach one statement; PostgreSQL refuses it
// ("cannot affect row a second time"), and the error is permanent, wraps PostgreSQL's and
// names the table and the likely keys, through Exec and through the Sink's pipelined batch.
func TestKeysEqualOnlyUnderTheDatabasesEqualityArePermanent(t *testing.T) {
	pool, schema := testenv.Postgres(t)
	ctx := testenv.Context(t, 30*time.Second)
	if _, err := pool.Exec(ctx, `CREATE COLLATION nocase (provider = icu, locale = 'und-u-ks-level2', deterministic = false)`); err != nil {
		t.Fatal(err)
	}
	s, err := pgfence.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	sink, err := pgbulk.NewSink(s, pool)
	if err != nil {
		t.Fatal(err)
	}
	k := fence.Key{Group: "g", Topic: schema, Partition: 0}
	tok := fence.Token{Epoch: 1}
	if _, err := s.Claim(ctx, k, tok, "test"); err != nil {
		t.Fatal(err)
	}
	pos := int64(0)
	for _, tc := range []struct {
		name, typ, colType string
		keys               []any
		want               string
	}{
		{"case variants", "text", "text COLLATE nocase", []any{"Seven", "seven"}, `("Seven") and ("seven")`},
		{"numeric text", "numeric", "numeric", []any{"1", "1.0"}, `("1") and ("1.0")`},
	} {
		table := strings.ReplaceAll(tc.name, " ", "_")
		foldTable(t, ctx, pool, table, tc.colType)
		up, err := pgbulk.NewUpsert(table, []string{"key"}, keyFold(tc.typ), foldSet)
		if err != nil {
			t.Fatal(err)
		}
		rows := [][]any{keyRow(tc.keys[0], 1), keyRow(tc.keys[1], 2)}
		check := func(how string, err error) {
			t.Helper()
			var pe *pgconn.PgError
			switch {
			case err == nil:
				t.Errorf("%s %s: keys %v written in one statement without an error", tc.name, how, tc.keys)
			case !errors.As(err, &pe) || pe.Code != "21000" || !consumer.IsPermanent(err):
				t.Errorf("%s %s: %v: want a permanent error wrapping SQLSTATE 21000", tc.name, how, err)
			case !strings.Contains(err.Error(), `"`+table+`"`) || !strings.Contains(err.Error(), tc.want):
				t.Errorf("%s %s: %v: want the table %q and the keys %s named", tc.name, how, err, table, tc.want)
			}
		}
		check("through Exec", pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return up.Exec(ctx, tx, rows) }))
		pos++
		check("through the Sink", sink.Apply(ctx, k, tok, pos, pos, func(ctx context.Context, tx pgx.Tx) error {
			return up.Exec(ctx, tx, rows)
		}))
		// One row at a time, as the consumer applies a batch whose error is permanent, both
		// rows are written.
		for _, r := range rows {
			pos++
			if err := sink.Apply(ctx, k, tok, pos, pos, func(ctx context.Context, tx pgx.Tx) error {
				return up.Exec(ctx, tx, [][]any{r})
			}); err != nil {
				t.Fatalf("%s: one row: %v", tc.name, err)
			}
		}
		var n, last int64
		if err := pool.QueryRow(ctx, `SELECT n, last FROM `+table).Scan(&n, &last); err != nil || n != 2 || last != 2 {
			t.Errorf("%s: n=%d last=%d (%v), want 2 and 2", tc.name, n, last, err)
		}
	}
}
