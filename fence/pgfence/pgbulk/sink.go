package pgbulk

import (
	"context"
	"errors"
	"fmt"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/pgtx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Sink is a pgfence store whose Apply sends the fence statement in the same round trip as
// the handler's first batch: the fast write path's other half. A consumer over it costs, per
// batch, begin, one batch (fence and writes) and commit, the same round trips as the same
// writes without a fence; over the store itself the fence is a round trip of its own.
//
// Apply begins a transaction and hands fn a pgx.Tx that advances the fence lazily, before
// the first statement fn sends:
//
//   - SendBatch (what [Upsert.Exec] calls): the fence statement is queued first in the same
//     batch (pgfence's AdvanceBatch), so the writes run after it, under the fence row's lock,
//     and roll back with the transaction if it refuses. The results of the queued statements
//     reach the callbacks set with QueuedQuery.Exec, Query or QueryRow; the returned
//     pgx.BatchResults reports only the batch's first error, from Close (its Exec, Query and
//     QueryRow fail with the error "pgbulk: the results of a batch pipelined with the fence
//     reach QueuedQuery callbacks only").
//   - anything else (Exec, Query, QueryRow, CopyFrom, Prepare, Begin, LargeObjects): the
//     fence is advanced on its own first (one round trip, as pgfence's Apply does), then the
//     call runs.
//
// If fn sends nothing, the fence is advanced before the commit. A refused fence fails
// Apply with the store's error (*fence.StaleError, fence.ErrDuplicate, fence.ErrInvalid),
// whatever fn did with it, and nothing fn wrote commits. Every other method is the store's.
type Sink struct {
	*pgfence.Store
	db Beginner
}

// Beginner begins the transactions of a [Sink]: a *pgxpool.Pool or a *pgx.Conn.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// errPipelinedResults is returned by the Exec, Query and QueryRow of the pgx.BatchResults of
// a batch that carried the fence statement: read results through QueuedQuery callbacks.
var errPipelinedResults = errors.New("pgbulk: the results of a batch pipelined with the fence reach QueuedQuery callbacks only")

// NewSink returns s with Apply pipelining the fence into the handler's first batch; db
// must be the database s was created on.
func NewSink(s *pgfence.Store, db Beginner) (*Sink, error) {
	if s == nil || db == nil {
		return nil, errors.New("pgbulk: NewSink: nil store or database")
	}
	return &Sink{Store: s, db: db}, nil
}

var _ fence.Sink[pgx.Tx] = (*Sink)(nil)

// Apply is pgfence's Apply with the fence statement pipelined into fn's first batch.
func (s *Sink) Apply(ctx context.Context, k fence.Key, t fence.Token, first, position int64, fn func(ctx context.Context, tx pgx.Tx) error) error {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pgbulk: apply %s: begin: %w", k, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // no-op after a commit
	ft := &fencedTx{Tx: tx, s: s.Store, k: k, t: t, first: first, pos: position}
	ferr := fn(ctx, ft)
	if ft.err != nil { // the fence refused or failed: that, not what fn made of it
		return ft.err
	}
	if ferr != nil {
		return ferr
	}
	if err := ft.advance(ctx); err != nil {
		return err
	}
	return pgtx.Commit(ctx, tx, "pgbulk", k, pgfence.ErrCommitUnknown)
}

// fencedTx is the transaction fn gets: it advances the fence before (or with) fn's first
// statement.
type fencedTx struct {
	pgx.Tx
	s        *pgfence.Store
	k        fence.Key
	t        fence.Token
	first    int64
	pos      int64
	advanced bool
	err      error // the fence's error, if it refused or failed
}

// advance advances the fence on its own, once.
func (f *fencedTx) advance(ctx context.Context) error {
	if f.advanced {
		return f.err
	}
	f.advanced = true
	f.err = f.s.Advance(ctx, f.Tx, f.k, f.t, f.first, f.pos)
	return f.err
}

func (f *fencedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if f.advanced {
		if f.err != nil {
			return errResults{err: f.err}
		}
		return f.Tx.SendBatch(ctx, b)
	}
	f.advanced = true
	err := f.s.AdvanceBatch(ctx, f.Tx, f.k, f.t, f.first, f.pos, func(fb *pgx.Batch) error {
		fb.QueuedQueries = append(fb.QueuedQueries, b.QueuedQueries...)
		return nil
	})
	if refused(err) {
		f.err = err // Apply returns it whatever fn does
	}
	return errResults{err: err}
}

// refused reports whether err is the fence's verdict rather than the caller's statements'.
func refused(err error) bool {
	var stale *fence.StaleError
	return errors.As(err, &stale) || errors.Is(err, fence.ErrDuplicate) || errors.Is(err, fence.ErrOverlap) ||
		errors.Is(err, fence.ErrNotClaimed) || errors.Is(err, fence.ErrInvalid)
}

func (f *fencedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := f.advance(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return f.Tx.Exec(ctx, sql, args...)
}

func (f *fencedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := f.advance(ctx); err != nil {
		return nil, err
	}
	return f.Tx.Query(ctx, sql, args...)
}

func (f *fencedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := f.advance(ctx); err != nil {
		return errRow{err}
	}
	return f.Tx.QueryRow(ctx, sql, args...)
}

func (f *fencedTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if err := f.advance(ctx); err != nil {
		return 0, err
	}
	return f.Tx.CopyFrom(ctx, table, cols, src)
}

func (f *fencedTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := f.advance(ctx); err != nil {
		return nil, err
	}
	return f.Tx.Prepare(ctx, name, sql)
}

func (f *fencedTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := f.advance(ctx); err != nil {
		return nil, err
	}
	return f.Tx.Begin(ctx)
}

func (f *fencedTx) LargeObjects() pgx.LargeObjects {
	_ = f.advance(context.Background())
	return f.Tx.LargeObjects()
}

// errResults are the results of a batch already read: Close reports its first error.
type errResults struct{ err error }

func (r errResults) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, r.errOr() }
func (r errResults) Query() (pgx.Rows, error)         { return nil, r.errOr() }
func (r errResults) QueryRow() pgx.Row                { return errRow{r.errOr()} }
func (r errResults) Close() error                     { return r.err }
func (r errResults) Tx() pgx.Tx                       { return nil } // the batch began no transaction

func (r errResults) errOr() error {
	if r.err != nil {
		return r.err
	}
	return errPipelinedResults
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
