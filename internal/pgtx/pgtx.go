// Package pgtx is what the write paths that run a fenced transaction of their own
// (fence/pgfence's Apply and fence/pgfence/pgbulk's Sink) share: the transaction they hand the
// handler, which pipelines its statements ([Pipe]), and the classification of a failed
// commit ([Commit]).
package pgtx

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/batonhq/baton/fence"
)

// Commit commits tx, the fenced transaction applying k, and tells a refused commit (nothing
// committed: the server refused it, or pgconn reports that nothing was sent) from one whose
// outcome is unknown, which it wraps in unknown. what (the package's name) prefixes the
// message of a refused commit.
func Commit(ctx context.Context, tx pgx.Tx, what string, k fence.Key, unknown error) error {
	err := tx.Commit(ctx)
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.Is(err, pgx.ErrTxCommitRollback) || errors.As(err, &pgErr) || pgconn.SafeToRetry(err) {
		return fmt.Errorf("%s: apply %s: commit failed, nothing committed: %w", what, k, err)
	}
	return fmt.Errorf("%w: apply %s: %w", unknown, k, err)
}
