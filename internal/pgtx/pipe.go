package pgtx

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/batonhq/baton/fence"
)

// Advance sends the fence statement of a fenced transaction first in one batch with the
// statements queue adds after it (fence/pgfence's Store.AdvanceBatch), and returns the fence's
// refusal or the first error of the batch.
type Advance func(ctx context.Context, tx pgx.Tx, queue func(b *pgx.Batch) error) error

// Pipe is the pgx.Tx a fenced write path hands its handler. Its Exec queues the statement and
// returns an empty pgconn.CommandTag at once; the queued statements are sent in order in one
// batch at the next flush point: Query, QueryRow, CopyFrom, SendBatch (the queued ones
// first), Prepare, Begin, LargeObjects, Conn, Commit, and [Pipe.Flush]. A statement that fails
// fails the flush with an error naming its position in the transaction and its SQL (wrapping
// the server's error), and every later call fails with it: nothing queued after a failure is
// sent, and the transaction cannot commit.
//
// An Exec without arguments, or whose first argument is a pgx.QueryExecMode, runs at once
// after a flush: pgx sends it with the simple protocol, which lets one string hold several
// statements, and a batch does not.
//
// With an [Advance], the fence statement travels first in the first flush. Until then nothing
// of the handler's has reached the server.
type Pipe struct {
	pgx.Tx
	what    string
	advance Advance // nil once the fence was sent, or with no fence
	fuse    bool    // a SendBatch before the fence travels in the fence's batch (pgbulk)
	queue   []*pgx.QueuedQuery
	n       int   // statements the handler issued, the position of the next one is n+1
	err     error // the first failure: every later call returns it
	refusal error // the fence's verdict, if it refused
}

// NewPipe returns the pipelining transaction over tx. what prefixes its errors ("pgfence");
// advance, if not nil, sends the fence statement in the first flush; fuse makes a SendBatch
// sent before the fence travel in the fence's batch, its results reaching the QueuedQuery
// callbacks only.
func NewPipe(tx pgx.Tx, what string, advance Advance, fuse bool) *Pipe {
	return &Pipe{Tx: tx, what: what, advance: advance, fuse: fuse}
}

// Refusal returns the fence's error if it refused (a *fence.StaleError, fence.ErrDuplicate,
// fence.ErrOverlap, fence.ErrNotClaimed or fence.ErrInvalid), whatever the handler did with it.
func (p *Pipe) Refusal() error { return p.refusal }

// Fenced reports whether the fence statement was sent (always, without an Advance).
func (p *Pipe) Fenced() bool { return p.advance == nil }

// Err returns the first failure of a flush, nil if none.
func (p *Pipe) Err() error { return p.err }

// Discard drops the statements queued and not sent.
func (p *Pipe) Discard() { p.queue = nil }

// Refused reports whether err is the fence's verdict rather than the statements'.
func Refused(err error) bool {
	var stale *fence.StaleError
	return errors.As(err, &stale) || errors.Is(err, fence.ErrDuplicate) || errors.Is(err, fence.ErrOverlap) ||
		errors.Is(err, fence.ErrNotClaimed) || errors.Is(err, fence.ErrInvalid)
}

// Flush sends the queued statements (and the fence statement first, if not sent yet) in one
// batch and returns the first failure, this flush's or an earlier one's.
func (p *Pipe) Flush(ctx context.Context) error {
	return p.send(ctx, nil)
}

// send flushes the queue followed by extra (with the fence statement first if not sent yet).
func (p *Pipe) send(ctx context.Context, extra []*pgx.QueuedQuery) error {
	if p.err != nil {
		return p.err
	}
	qs := append(p.queue, extra...)
	p.queue = nil
	var err error
	if adv := p.advance; adv != nil {
		p.advance = nil
		err = adv(ctx, p.Tx, func(b *pgx.Batch) error {
			b.QueuedQueries = append(b.QueuedQueries, qs...)
			return nil
		})
		if Refused(err) {
			p.refusal = err
		}
	} else if len(qs) > 0 {
		err = p.Tx.SendBatch(ctx, &pgx.Batch{QueuedQueries: qs}).Close()
	}
	if err != nil {
		p.err = err
	}
	return err
}

// next counts a statement of the handler's and returns its position.
func (p *Pipe) next() int {
	p.n++
	return p.n
}

// queued returns sql queued with a callback that names it in its error.
func (p *Pipe) queued(sql string, args []any) *pgx.QueuedQuery {
	q := &pgx.QueuedQuery{SQL: sql, Arguments: args}
	pos, what := p.next(), p.what
	q.Fn = func(br pgx.BatchResults) error {
		if _, err := br.Exec(); err != nil {
			return &statementError{what: what, pos: pos, sql: sql, err: err}
		}
		return nil
	}
	return q
}

// statementError is the failure of a queued statement: its position in the transaction, its
// SQL, and the server's error, which errors.Is and errors.As find.
type statementError struct {
	what string
	pos  int
	sql  string
	err  error
}

func (e *statementError) Error() string {
	return fmt.Sprintf("%s: statement %d of the transaction (%s): %v", e.what, e.pos, Shorten(e.sql), e.err)
}

func (e *statementError) Unwrap() error { return e.err }

// Permanent reports whether the server refused the statement for its data, which a retry of
// the same batch sends again: SQLSTATE class 22 (data exception) or 23 (integrity constraint
// violation) but a foreign key's (23503), which a write elsewhere can satisfy. The consumer
// reads it (consumer.IsPermanent), the way a handler marks an error it sees itself: it applies
// the batch one record at a time and dead-letters the record that fails alone. A handler does
// not see the error of a queued statement in time to mark it.
func (e *statementError) Permanent() bool {
	var pe *pgconn.PgError
	if !errors.As(e.err, &pe) || len(pe.Code) != 5 {
		return false
	}
	return (pe.Code[:2] == "22" || pe.Code[:2] == "23") && pe.Code != "23503"
}

// Shorten returns sql on one line, at most 60 bytes of it.
func Shorten(sql string) string {
	s := strings.Join(strings.Fields(sql), " ")
	if len(s) > 60 {
		s = s[:57] + "..."
	}
	return s
}

func (p *Pipe) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if p.err != nil {
		return pgconn.CommandTag{}, p.err
	}
	if len(args) == 0 || isMode(args[0]) {
		if err := p.Flush(ctx); err != nil {
			return pgconn.CommandTag{}, err
		}
		p.next()
		return p.Tx.Exec(ctx, sql, args...)
	}
	p.queue = append(p.queue, p.queued(sql, args))
	return pgconn.CommandTag{}, nil
}

func isMode(a any) bool {
	_, ok := a.(pgx.QueryExecMode)
	return ok
}

func (p *Pipe) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := p.Flush(ctx); err != nil {
		return errRows{err}, err
	}
	p.next()
	return p.Tx.Query(ctx, sql, args...)
}

func (p *Pipe) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := p.Flush(ctx); err != nil {
		return errRow{err}
	}
	p.next()
	return p.Tx.QueryRow(ctx, sql, args...)
}

// SendBatch sends the queued statements, then b. With fuse and the fence not sent yet, the
// three travel as one batch and b's results reach its QueuedQuery callbacks only: the
// returned pgx.BatchResults reports the batch's first error from Close.
func (p *Pipe) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if p.err != nil {
		return errResults{what: p.what, err: p.err}
	}
	if p.fuse && p.advance != nil {
		p.n += len(b.QueuedQueries)
		return errResults{what: p.what, err: p.send(ctx, b.QueuedQueries)}
	}
	if err := p.Flush(ctx); err != nil {
		return errResults{what: p.what, err: err}
	}
	p.n += len(b.QueuedQueries)
	return p.Tx.SendBatch(ctx, b)
}

func (p *Pipe) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if err := p.Flush(ctx); err != nil {
		return 0, err
	}
	p.next()
	return p.Tx.CopyFrom(ctx, table, cols, src)
}

func (p *Pipe) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := p.Flush(ctx); err != nil {
		return nil, err
	}
	return p.Tx.Prepare(ctx, name, sql)
}

// Begin flushes, then begins a savepoint: its statements run at once, unpipelined.
func (p *Pipe) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := p.Flush(ctx); err != nil {
		return nil, err
	}
	return p.Tx.Begin(ctx)
}

func (p *Pipe) LargeObjects() pgx.LargeObjects {
	_ = p.Flush(context.Background())
	return p.Tx.LargeObjects()
}

// Conn flushes, then returns the connection: what runs on it runs at once, unpipelined.
func (p *Pipe) Conn() *pgx.Conn {
	_ = p.Flush(context.Background())
	return p.Tx.Conn()
}

// Commit flushes and commits only if every statement succeeded (and the fence admitted them).
func (p *Pipe) Commit(ctx context.Context) error {
	if err := p.Flush(ctx); err != nil {
		return err
	}
	return p.Tx.Commit(ctx)
}

func (p *Pipe) Rollback(ctx context.Context) error {
	p.queue = nil
	return p.Tx.Rollback(ctx)
}

// errResults are the results of a batch already read (or never sent): Close reports its
// first error; Exec, Query and QueryRow that error too, or that the results reached the
// QueuedQuery callbacks only.
type errResults struct {
	what string
	err  error
}

func (r errResults) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, r.errOr() }
func (r errResults) Query() (pgx.Rows, error)         { return errRows{r.errOr()}, r.errOr() }
func (r errResults) QueryRow() pgx.Row                { return errRow{r.errOr()} }
func (r errResults) Close() error                     { return r.err }
func (r errResults) Tx() pgx.Tx                       { return nil } // the batch began no transaction

func (r errResults) errOr() error {
	if r.err != nil {
		return r.err
	}
	return fmt.Errorf("%s: the results of a batch pipelined with the fence reach QueuedQuery callbacks only", r.what)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// errRows are the rows of a query never sent.
type errRows struct{ err error }

func (errRows) Close()                                       {}
func (r errRows) Err() error                                 { return r.err }
func (errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (errRows) Next() bool                                   { return false }
func (r errRows) Scan(...any) error                          { return r.err }
func (r errRows) Values() ([]any, error)                     { return nil, r.err }
func (errRows) RawValues() [][]byte                          { return nil }
func (errRows) Conn() *pgx.Conn                              { return nil }
func (errRows) TypeMap() *pgtype.Map                         { return nil }

// Exec runs sql on q at once and returns its command tag: the way to read what a statement
// did (rows affected) in a transaction that may be a [Pipe], whose Exec returns an empty tag.
func Exec(ctx context.Context, q interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, sql string, args ...any) (pgconn.CommandTag, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	rows.Close()
	return rows.CommandTag(), rows.Err()
}
