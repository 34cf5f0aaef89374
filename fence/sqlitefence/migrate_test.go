package sqlitefence

import (
	"database/sql"
	"errors"
	"slices"
	"testing"

	"github.com/batonhq/baton/fence"
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
	if _, err := s.Claim(ctx, key1, tok(0, 1), "fencetest"); err != nil {
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
	if len(want) != 5 || !slices.Equal(got, want) { // fence, recoveries + index, keyed, topics
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

// A fence table created before the claimant column existed is upgraded by Migrate; its rows
// hold their token for nobody, so an equal claim is refused and a higher one takes it.
func TestMigrateAddsClaimant(t *testing.T) {
	ctx := t.Context()
	db := openPlainDB(t, tempPath(t), "_busy_timeout=5000")
	if _, err := db.ExecContext(ctx, `CREATE TABLE baton_fences (grp TEXT NOT NULL, topic TEXT NOT NULL,
		partition INTEGER NOT NULL, era INTEGER NOT NULL, epoch INTEGER NOT NULL, position INTEGER NOT NULL,
		PRIMARY KEY (grp, topic, partition)) STRICT, WITHOUT ROWID;
		INSERT INTO baton_fences VALUES ('g', 't', 0, 0, 5, 9);`); err != nil {
		t.Fatal(err)
	}
	s, err := New(db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for range 2 {
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	k := fence.Key{Group: "g", Topic: "t", Partition: 0}
	if st, err := s.Load(ctx, k); err != nil || st != (fence.State{Token: fence.Token{Epoch: 5}, Position: 9}) {
		t.Fatalf("legacy row = %+v, %v", st, err)
	}
	if _, err := s.Claim(ctx, k, fence.Token{Epoch: 5}, "c"); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("equal claim of a legacy row: %v, want stale", err)
	}
	if st, err := s.Claim(ctx, k, fence.Token{Epoch: 6}, "c"); err != nil || st.Position != 9 || st.Claimant != "c" {
		t.Fatalf("higher claim of a legacy row = %+v, %v", st, err)
	}
}
