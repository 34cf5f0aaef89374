package sqlitefence

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/fencetest"
)

// occEnv builds the OCC suite's Env over db, with names that need quoting (mixed case, a
// reserved word).
func occEnv(t *testing.T, db *sql.DB) fencetest.OCCEnv[RowQuerier] {
	t.Helper()
	const table, key, version = "Orders", "order", "Rev"
	if _, err := db.Exec(`CREATE TABLE "Orders" ("order" TEXT PRIMARY KEY, value TEXT, "Rev" INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	v, err := NewVersioned(table, KeyColumn(key), VersionColumn(version))
	if err != nil {
		t.Fatal(err)
	}
	return fencetest.OCCEnv[RowQuerier]{
		Versioned: v, Table: table, Key: key, Version: version,
		Begin: func(ctx context.Context) (RowQuerier, func() error, func() error, error) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return nil, nil, nil, err
			}
			return tx, tx.Commit, tx.Rollback, nil
		},
		Read: func(ctx context.Context, id string) (string, int64, bool, error) {
			var val string
			var ver int64
			err := db.QueryRowContext(ctx, `SELECT value, "Rev" FROM "Orders" WHERE "order" = ?`, id).Scan(&val, &ver)
			if errors.Is(err, sql.ErrNoRows) {
				return "", 0, false, nil
			}
			return val, ver, err == nil, err
		},
		Names: func(table, key, version string) error {
			_, err := NewVersioned(table, KeyColumn(key), VersionColumn(version))
			return err
		},
	}
}

// TestOCCConformance runs the fence suite's OCC cases over Open's database (BEGIN IMMEDIATE).
func TestOCCConformance(t *testing.T) {
	fencetest.RunOCC(t, func(t *testing.T) fencetest.OCCEnv[RowQuerier] {
		return occEnv(t, openT(t, filepath.Join(t.TempDir(), "occ.db")).DB())
	})
}

// TestOCCConformanceDeferred runs them over a caller-owned database without _txlock: every
// transaction is DEFERRED and takes the write lock at its first write.
func TestOCCConformanceDeferred(t *testing.T) {
	fencetest.RunOCC(t, func(t *testing.T) fencetest.OCCEnv[RowQuerier] {
		return occEnv(t, openPlainDB(t, filepath.Join(t.TempDir(), "occ.db"), "_busy_timeout=5000"))
	})
}

func TestNewVersionedReportsEveryProblem(t *testing.T) {
	_, err := NewVersioned(`t"x`, KeyColumn(""), nil, VersionColumn("a.b"))
	if !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("NewVersioned = %v, want ErrInvalid", err)
	}
	for _, want := range []string{"versioned table", "key column", "option 1 is nil", "version column"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// TestVersionedOnDB: a write on the *sql.DB (no transaction) commits on its own, with an
// integer key as in the seeds' work_order example.
func TestVersionedOnDB(t *testing.T) {
	db := openT(t, filepath.Join(t.TempDir(), "occ.db")).DB()
	ctx := t.Context()
	if _, err := db.Exec(`CREATE TABLE work_order (id INTEGER PRIMARY KEY, status TEXT NOT NULL, version INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	v, err := NewVersioned("work_order")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Write(ctx, nil, 4711, 0, fence.Column{Name: "status", Value: "CREATED"}); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("nil querier: %v, want ErrInvalid", err)
	}
	if n, err := v.Write(ctx, db, 4711, 0, fence.Column{Name: "status", Value: "CREATED"}); err != nil || n != 1 {
		t.Fatalf("create = %d, %v", n, err)
	}
	if n, err := v.Write(ctx, db, 4711, 1, fence.Column{Name: "status", Value: "RELEASED"}); err != nil || n != 2 {
		t.Fatalf("update = %d, %v", n, err)
	}
	_, err = v.Write(ctx, db, 4711, 1, fence.Column{Name: "status", Value: "CANCELLED"})
	var ce *fence.VersionConflictError
	if !errors.As(err, &ce) || ce.Expected != 1 || ce.Found != 2 {
		t.Fatalf("stale write = %v, want a conflict expected 1 found 2", err)
	}
	var status string
	if err := db.QueryRow(`SELECT status FROM work_order WHERE id = 4711`).Scan(&status); err != nil || status != "RELEASED" {
		t.Fatalf("status = %q, %v", status, err)
	}
}
