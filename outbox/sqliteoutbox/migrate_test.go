package sqliteoutbox_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"slices"
	"testing"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/sqliteoutbox"
)

// New does no I/O: it succeeds on a closed database and Migrate reports the closing.
func TestNewDoesNoIO(t *testing.T) {
	db, err := sql.Open("sqlite", "file://"+filepath.Join(t.TempDir(), "x.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := sqliteoutbox.New(mustFences(t, db))
	if err != nil {
		t.Fatalf("New on a closed *sql.DB: %v", err)
	}
	if err := s.Migrate(t.Context()); err == nil {
		t.Fatal("Migrate on a closed *sql.DB succeeded")
	}
}

// Migrate is idempotent (over data too), and Schema is exactly what it runs.
func TestMigrateAndSchema(t *testing.T) {
	ctx, _, store := open(t) // migrated once
	migrated := store
	for range 2 {
		if err := migrated.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	dbOf := func(name string) *sql.DB {
		db, err := sql.Open("sqlite", "file://"+filepath.Join(t.TempDir(), name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	a, b := dbOf("a.db"), dbOf("b.db")
	sa, err := sqliteoutbox.New(mustFences(t, a), sqliteoutbox.Table("main.ob"))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := sa.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.ExecContext(ctx, sa.Schema()); err != nil {
		t.Fatal(err)
	}
	got, want := objects(t, b), objects(t, a)
	if len(want) != 3 || !slices.Equal(got, want) {
		t.Errorf("Schema() created %q\nMigrate created %q", got, want)
	}
}

func objects(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query(`SELECT type || ' ' || name || ': ' || coalesce(sql, '') FROM sqlite_master
		WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// A database migrated before dead letters existed (no dead-letter table) gains it at the next
// Migrate, with its pending rows intact, and the relay can dead-letter them.
func TestMigrateAddsDeadLettersToAnOldDatabase(t *testing.T) {
	ctx, fences, store := open(t)
	tok := fence.Token{Epoch: 1}
	if _, err := fences.Claim(ctx, src, tok, "test"); err != nil {
		t.Fatal(err)
	}
	if err := fences.Apply(ctx, src, tok, 0, 0, func(ctx context.Context, tx *sql.Tx) error {
		return store.Append(ctx, tx, src, tok, outbox.Message{Topic: "d", Value: []byte("a")}, outbox.Message{Topic: "d", Value: []byte("b")})
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := fences.DB().ExecContext(ctx, `DROP TABLE baton_outbox_dead_letters`); err != nil { // the old schema
		t.Fatal(err)
	}
	if _, err := store.DeadLetter(ctx, src, tok, 1, "r"); err == nil {
		t.Fatal("DeadLetter without the table succeeded")
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if b, err := store.DeadLetter(ctx, src, tok, 1, "r"); err != nil || b != 1 {
		t.Fatalf("DeadLetter after Migrate = %d, %v", b, err)
	}
	if rows, err := store.Pending(ctx, src, tok, 10); err != nil || len(rows) != 1 || string(rows[0].Value) != "b" {
		t.Fatalf("Pending after Migrate = %v, %v", rows, err)
	}
}

// mustFences is an sqlitefence store over db, which New does no I/O for.
func mustFences(t *testing.T, db *sql.DB) *sqlitefence.Store {
	t.Helper()
	f, err := sqlitefence.New(db)
	if err != nil {
		t.Fatal(err)
	}
	return f
}
