package pgbulk

import (
	"context"
	"errors"
	"fmt"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/pgtx"
	"github.com/jackc/pgx/v5"
)

// Sink is a pgfence store whose Apply sends the fence statement in the same round trip as
// the handler's first batch: the fast write path's other half. A consumer over it costs, per
// batch, begin, one batch (fence and writes) and commit when the handler sends one SendBatch
// ([Upsert.Exec]), the same round trips as the same writes without a fence; over the store
// itself the fence is a round trip of its own.
//
// Apply begins a transaction and hands fn a pgx.Tx that pipelines, as pgfence's Apply does
// (see package pgfence: Exec queues its statement and returns an empty pgconn.CommandTag;
// the queued statements travel in one batch at the next read, SendBatch, CopyFrom, Prepare,
// Begin, LargeObjects, Conn or at the commit), and that sends the fence statement first in
// the first of those batches:
//
//   - SendBatch (what [Upsert.Exec] calls) before anything was sent: the fence statement,
//     the queued statements and the batch's travel as one batch (pgfence's AdvanceBatch), so
//     the writes run after the fence, under the fence row's lock, and roll back with the
//     transaction if it refuses. The results of the batch's statements reach the callbacks
//     set with QueuedQuery.Exec, Query or QueryRow; the returned pgx.BatchResults reports
//     only the batch's first error, from Close (its Exec, Query and QueryRow fail with the
//     error "pgbulk: the results of a batch pipelined with the fence reach QueuedQuery
//     callbacks only"). The callbacks run as the results arrive, before the fence's verdict
//     is read: a zombie's callbacks may see its statements succeed (they roll back). Act on
//     them only inside the transaction; a callback that calls the transaction gets an error
//     saying it is busy (Conn and LargeObjects return as they are, nothing sent).
//   - the first Exec: the fence statement and the Exec's travel as one batch, at once, and
//     Exec returns the fence's refusal or its statement's error, so a zombie's handler stops
//     at its first write; the Execs after it are queued.
//   - a read (Query, QueryRow) or CopyFrom, Prepare, Begin, LargeObjects, Conn, or an Exec
//     without arguments: the fence (and the queued statements) are sent first in one batch,
//     then the call runs.
//
// If fn sends nothing, the fence travels with the queued statements before the commit; if fn
// fails before anything was sent, the fence is advanced alone so that its refusal is reported
// over fn's error. A refused fence fails Apply with the store's error (*fence.StaleError,
// fence.ErrDuplicate, fence.ErrInvalid), whatever fn did with it, and nothing fn wrote
// commits; after a refusal sent by Conn or LargeObjects, every statement fn runs on them fails.
// One case reports a statement's error instead: a first batch whose statement PostgreSQL
// cannot prepare fails before the fence statement runs, so Apply returns that statement's
// error (nothing runs, nothing commits). Every other method is the store's.
type Sink struct {
	*pgfence.Store
	db Beginner
}

// Beginner begins the transactions of a [Sink]: a *pgxpool.Pool or a *pgx.Conn.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

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
	p := pgtx.NewPipe(ctx, tx, "pgbulk", func(ctx context.Context, tx pgx.Tx, queue func(*pgx.Batch) error) error {
		return s.AdvanceBatch(ctx, tx, k, t, first, position, queue)
	}, true)
	ferr := fn(ctx, p)
	if err := p.Refusal(); err != nil { // the fence refused: that, not what fn made of it
		return err
	}
	if ferr != nil {
		if !p.Fenced() {
			// Nothing was sent: the fence alone, without fn's statements, so that a refusal
			// is reported over fn's error as it is once the fence was sent.
			p.Discard()
			if err := p.Flush(ctx); pgtx.Refused(err) {
				return err
			}
		}
		return pgtx.Classify(ferr)
	}
	if err := p.Flush(ctx); err != nil { // the fence (if fn sent nothing) and fn's queued statements
		return pgtx.Classify(err)
	}
	return pgtx.Classify(pgtx.Commit(ctx, tx, "pgbulk", k, pgfence.ErrCommitUnknown))
}
