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
func occEnv(t *testing.T, db *sql.DB) fencetest.OCCEnv[*sql.Tx] {
	t.Helper()
	const table, key, version = "Orders", "order", "Rev"
	if _, err := db.Exec(`CREATE TABLE "Orders" ("order" TEXT PRIMARY KEY, value TEXT, "Rev" INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	v, err := NewVersioned(table, key, version)
	if err != nil {
		t.Fatal(err)
	}
	return fencetest.OCCEnv[*sql.Tx]{
		Versioned: v, Table: table, Key: key, Version: version,
		Begin: func(ctx context.Context) (*sql.Tx, func() error, func() error, error) {
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
			_, err := NewVersioned(table, key, version)
			return err
		},
	}
}

// TestOCCConformance runs the fence suite's OCC cases over Open's database (BEGIN IMMEDIATE).
func TestOCCConformance(t *testing.T) {
	fencetest.RunOCC(t, func(t *testing.T) fencetest.OCCEnv[*sql.Tx] {
		return occEnv(t, openT(t, filepath.Join(t.TempDir(), "occ.db")).DB())
	})
}

// TestOCCConformanceDeferred runs them over a caller-owned database without _txlock: every
// transaction is DEFERRED and takes the write lock at its first write.
func TestOCCConformanceDeferred(t *testing.T) {
	fencetest.RunOCC(t, func(t *testing.T) fencetest.OCCEnv[*sql.Tx] {
		return occEnv(t, openPlainDB(t, filepath.Join(t.TempDir(), "occ.db"), "_busy_timeout=5000"))
	})
}

func TestNewVersionedReportsEveryProblem(t *testing.T) {
	_, err := NewVersioned(`t"x`, "", "a.b")
	if !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("NewVersioned = %v, want ErrInvalid", err)
	}
	for _, want := range []string{"versioned table", "key column", "version column"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// TestVersionedInTransaction: a write belongs to the caller's *sql.Tx, with an integer key as
// in the seeds' work_order example, and a nil tx fails before any I/O.
func TestVersionedInTransaction(t *testing.T) {
	db := openT(t, filepath.Join(t.TempDir(), "occ.db")).DB()
	ctx := t.Context()
	if _, err := db.Exec(`CREATE TABLE work_order (id INTEGER PRIMARY KEY, status TEXT NOT NULL, version INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	v, err := NewVersioned("work_order", "id", "version")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Write(ctx, nil, 4711, 0, fence.Column{Name: "status", Value: "CREATED"}); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("nil tx: %v, want ErrInvalid", err)
	}
	write := func(expected int64, status string) (int64, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		n, err := v.Write(ctx, tx, 4711, expected, fence.Column{Name: "status", Value: status})
		if err != nil {
			_ = tx.Rollback()
			return n, err
		}
		return n, tx.Commit()
	}
	if n, err := write(0, "CREATED"); err != nil || n != 1 {
		t.Fatalf("create = %d, %v", n, err)
	}
	if n, err := write(1, "RELEASED"); err != nil || n != 2 {
		t.Fatalf("update = %d, %v", n, err)
	}
	_, err = write(1, "CANCELLED")
	var ce *fence.VersionConflictError
	if !errors.As(err, &ce) || ce.Expected != 1 || ce.Found != 2 {
		t.Fatalf("stale write = %v, want a conflict expected 1 found 2", err)
	}
	var status string
	if err := db.QueryRow(`SELECT status FROM work_order WHERE id = 4711`).Scan(&status); err != nil || status != "RELEASED" {
		t.Fatalf("status = %q, %v", status, err)
	}
}
