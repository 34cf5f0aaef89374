package pgmigrate

import (
	"context"
	"fmt"
	"hash/fnv"

	"github.com/jackc/pgx/v5"
)

// Beginner is what Run needs: *pgxpool.Pool, *pgx.Conn and pgx.Tx all satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// LockID hashes name (FNV-1a, 64 bits) into an advisory lock key.
func LockID(name string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return int64(h.Sum64())
}

// Run executes script in one transaction holding the advisory lock of lockName. The script
// is sent without arguments, so pgx uses the simple protocol and several statements run at
// once. Errors are prefixed with what (e.g. "pgfence: migrate").
func Run(ctx context.Context, db Beginner, lockName, script, what string) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", LockID(lockName)); err != nil {
		return fmt.Errorf("%s: lock: %w", what, err)
	}
	if _, err := tx.Exec(ctx, script); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("%s: commit: %w", what, err)
	}
	return nil
}
