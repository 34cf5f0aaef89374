package sqliteoutbox_test

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/outbox/pgoutbox"
)

// TestDefaultTableNamesAgree: a deployment's tables are named alike in PostgreSQL and SQLite,
// companion tables included.
func TestDefaultTableNamesAgree(t *testing.T) {
	_, fences, _ := open(t)
	rows, err := fences.DB().Query(`SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		got = append(got, n)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := []string{"baton_fences", "baton_fences_keyed", "baton_fences_recoveries", "baton_fences_topics", "baton_outbox", "baton_outbox_cursors", "baton_outbox_dead_letters"}
	if !slices.Equal(got, want) {
		t.Errorf("SQLite tables = %v, want %v", got, want)
	}
	// The PostgreSQL stores create the same names.
	pf, err := pgfence.New(nopDB{})
	if err != nil {
		t.Fatal(err)
	}
	if fences.Table() != pf.Table() {
		t.Errorf("default fence tables differ: sqlite %q, postgres %q", fences.Table(), pf.Table())
	}
	po, err := pgoutbox.New(nopDB{}, pf)
	if err != nil {
		t.Fatal(err)
	}
	var pg []string
	for _, m := range regexp.MustCompile(`CREATE TABLE IF NOT EXISTS "?(\w+)"?`).FindAllStringSubmatch(pf.Schema()+po.Schema(), -1) {
		pg = append(pg, strings.Trim(m[1], `"`))
	}
	slices.Sort(pg)
	if !slices.Equal(pg, want) {
		t.Errorf("PostgreSQL tables = %v, want %v", pg, want)
	}
}

// nopDB satisfies pgfence.DB and pgoutbox.DB; New does no I/O, so it is never called.
type nopDB struct{}

func (nopDB) Begin(context.Context) (pgx.Tx, error) { panic("no I/O expected") }
func (nopDB) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	panic("no I/O expected")
}
func (nopDB) Query(context.Context, string, ...any) (pgx.Rows, error) { panic("no I/O expected") }
func (nopDB) QueryRow(context.Context, string, ...any) pgx.Row        { panic("no I/O expected") }
