package sqlitefence

import (
	"database/sql"
	"slices"
	"testing"
)

// New does no I/O: it succeeds on a closed database and the first use reports the closing.
func TestNewDoesNoIO(t *testing.T) {
	db, err := sql.Open("sqlite", "file://"+tempPath(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := New(db)
	if err != nil {
		t.Fatalf("New on a closed *sql.DB: %v", err)
	}
	defer s.Close()
	if err := s.Migrate(t.Context()); err == nil {
		t.Fatal("Migrate on a closed *sql.DB succeeded")
	}
}

// Migrate is idempotent, and Schema is exactly what it runs: a database migrated twice and
// one given Schema by hand end up with the same tables and indexes.
func TestMigrateAndSchema(t *testing.T) {
	ctx := t.Context()
	migrated := openPlainDB(t, tempPath(t), "_busy_timeout=5000")
	s, err := New(migrated, Table("main.fx"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for range 2 {
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Claim(ctx, key1, tok(0, 1)); err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil { // and once more over data
		t.Fatal(err)
	}
	if st, err := s.Load(ctx, key1); err != nil || st.Token != tok(0, 1) {
		t.Fatalf("after a third Migrate: load = %v, %v; want the claimed token", st, err)
	}

	byHand := openPlainDB(t, tempPath(t))
	if _, err := byHand.ExecContext(ctx, s.Schema()); err != nil {
		t.Fatal(err)
	}
	got, want := schemaObjects(t, byHand), schemaObjects(t, migrated)
	if len(want) != 4 || !slices.Equal(got, want) {
		t.Errorf("Schema() created %q\nMigrate created %q", got, want)
	}
}

// schemaObjects lists the type, name and SQL of every table and index in db.
func schemaObjects(t *testing.T, db *sql.DB) []string {
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
