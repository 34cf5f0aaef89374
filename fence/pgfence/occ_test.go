package pgfence

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/fencetest"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// TestOCCConformance runs the fence suite's OCC cases against a real PostgreSQL, each case in
// its own schema, with names that need quoting (mixed case, a reserved word).
func TestOCCConformance(t *testing.T) {
	fencetest.RunOCC(t, func(t *testing.T) fencetest.OCCEnv[pgx.Tx] {
		pool, _ := testenv.Postgres(t)
		ctx := testenv.Context(t, time.Minute)
		const table, key, version = "Orders", "order", "Rev"
		if _, err := pool.Exec(ctx, `CREATE TABLE "Orders" ("order" text PRIMARY KEY, value text, "Rev" bigint NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		v, err := NewVersioned(table, key, version)
		if err != nil {
			t.Fatal(err)
		}
		return fencetest.OCCEnv[pgx.Tx]{
			Versioned: v, Table: table, Key: key, Version: version,
			Begin: func(ctx context.Context) (pgx.Tx, func() error, func() error, error) {
				tx, err := pool.Begin(ctx)
				if err != nil {
					return nil, nil, nil, err
				}
				rollback := func() error {
					rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					return tx.Rollback(rctx)
				}
				return tx, func() error { return tx.Commit(ctx) }, rollback, nil
			},
			Read: func(ctx context.Context, id string) (string, int64, bool, error) {
				var val string
				var ver int64
				err := pool.QueryRow(ctx, `SELECT value, "Rev" FROM "Orders" WHERE "order" = $1`, id).Scan(&val, &ver)
				if errors.Is(err, pgx.ErrNoRows) {
					return "", 0, false, nil
				}
				return val, ver, err == nil, err
			},
			Names: func(table, key, version string) error {
				_, err := NewVersioned(table, key, version)
				return err
			},
		}
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

// TestVersionedInTransaction: a write belongs to the caller's pgx.Tx (here through
// pgx.BeginFunc on the pool), and a nil tx fails before any I/O.
func TestVersionedInTransaction(t *testing.T) {
	pool, _ := testenv.Postgres(t)
	ctx := testenv.Context(t, 30*time.Second)
	if _, err := pool.Exec(ctx, `CREATE TABLE work_order (id bigint PRIMARY KEY, status text NOT NULL, version bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	v, err := NewVersioned("work_order", "id", "version")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Write(ctx, nil, 4711, 0, fence.Column{Name: "status", Value: "CREATED"}); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("nil tx: %v, want ErrInvalid", err)
	}
	write := func(expected int64, status string) (n int64, err error) {
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			n, err = v.Write(ctx, tx, int64(4711), expected, fence.Column{Name: "status", Value: status})
			return err
		})
		return n, err
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
	if err := pool.QueryRow(ctx, `SELECT status FROM work_order WHERE id = 4711`).Scan(&status); err != nil || status != "RELEASED" {
		t.Fatalf("status = %q, %v", status, err)
	}
}
