package pgtx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

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
// Once the handler calls Begin, Conn or LargeObjects, or runs an Exec without arguments or
// whose first argument is a pgx.QueryExecMode (pgx sends it with the simple protocol, which
// lets one string hold several statements, SAVEPOINT among them), the queue is flushed and
// every later Exec runs at once and returns its own error: the handler may recover from it
// (ROLLBACK TO SAVEPOINT), and its statements run in the order it issues them on every handle
// of the transaction.
//
// With an [Advance], the fence statement travels first in the first flush, and the first Exec
// is one: it sends the fence statement and its own in one batch and returns the fence's
// refusal or its statement's error, so a zombie's handler stops at its first write. Until
// then nothing of the handler's has reached the server.
//
// A Pipe's methods hold a mutex, so that several goroutines calling them lose no statement;
// the statements of a transaction still run one at a time, in the order the calls took it.
type Pipe struct {
	pgx.Tx
	mu       sync.Mutex
	flushing atomic.Bool     // a flush is under way: its batch's QueuedQuery callbacks may be running
	ctx      context.Context // Apply's: bounds the flushes of the calls that take no context
	what     string
	advance  Advance // nil once the fence was sent, or with no fence
	fuse     bool    // a SendBatch before the fence travels in the fence's batch (pgbulk)
	direct   bool    // every Exec runs at once (a savepoint, the connection, the simple protocol)
	queue    []*pgx.QueuedQuery
	pos      []int // the position of each queued statement in the transaction
	n        int   // statements the handler issued, the position of the next one is n+1
	err      error // the first failure: every later call returns it
	refusal  error // the fence's verdict, if it refused
}

// NewPipe returns the pipelining transaction over tx. ctx (Apply's) bounds the flushes of
// the calls that take no context (Conn, LargeObjects); what prefixes its errors ("pgfence");
// advance, if not nil, sends the fence statement in the first flush; fuse makes a SendBatch
// sent before the fence travel in the fence's batch, its results reaching the QueuedQuery
// callbacks only.
func NewPipe(ctx context.Context, tx pgx.Tx, what string, advance Advance, fuse bool) *Pipe {
	return &Pipe{Tx: tx, ctx: ctx, what: what, advance: advance, fuse: fuse}
}

// Refusal returns the fence's error if it refused (a *fence.StaleError, fence.ErrDuplicate,
// fence.ErrOverlap, fence.ErrNotClaimed or fence.ErrInvalid), whatever the handler did with it.
func (p *Pipe) Refusal() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refusal
}

// Fenced reports whether the fence statement was sent (always, without an Advance).
func (p *Pipe) Fenced() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.advance == nil
}

// Err returns the first failure of a flush, nil if none.
func (p *Pipe) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Discard drops the statements queued and not sent.
func (p *Pipe) Discard() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.queue, p.pos = nil, nil
}

// Refused reports whether err is the fence's verdict rather than the statements'.
func Refused(err error) bool {
	var stale *fence.StaleError
	return errors.As(err, &stale) || errors.Is(err, fence.ErrDuplicate) || errors.Is(err, fence.ErrOverlap) ||
		errors.Is(err, fence.ErrNotClaimed) || errors.Is(err, fence.ErrInvalid)
}

// Flush sends the queued statements (and the fence statement first, if not sent yet, even
// with nothing queued) in one batch and returns the first failure, this flush's or an earlier
// one's.
func (p *Pipe) Flush(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.send(ctx, nil, 0)
}

// send flushes the queue followed by extra, the handler's statements from position at on
// (with the fence statement first if not sent yet). p.mu is held.
func (p *Pipe) send(ctx context.Context, extra []*pgx.QueuedQuery, at int) error {
	if p.err != nil {
		return p.err
	}
	qs, pos := append(p.queue, extra...), p.pos
	for i := range extra {
		pos = append(pos, at+i)
	}
	p.queue, p.pos = nil, nil
	p.flushing.Store(true)
	defer p.flushing.Store(false)
	var err error
	withFence := p.advance != nil
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
	if err != nil && !Refused(err) && unprepared(err) {
		err = p.unprepared(ctx, qs, pos, err, withFence)
	}
	if err != nil {
		p.err = err
	}
	return err
}

// unprepared reports whether err is pgx's failure to prepare the statements of a batch,
// before any of them ran.
func unprepared(err error) bool {
	return strings.Contains(err.Error(), "error preprocessing batch (prepare)")
}

// unprepared names the statement of qs whose preparation failed the batch, which pgx does not
// tell: the transaction, aborted by the failure, is rolled back, and the statements are
// prepared one by one (parsed, never run) on its connection until one fails. Found, its error
// is the statement's; not found (a statement that depends on what the transaction did, or
// the fence's own when the fence statement was in the batch), err stands, and without the
// fence statement in the batch it is the handler's queued statements'.
func (p *Pipe) unprepared(ctx context.Context, qs []*pgx.QueuedQuery, pos []int, err error, withFence bool) error {
	if p.Tx.Rollback(ctx) == nil {
		pc := p.Tx.Conn().PgConn()
		for i, q := range qs {
			_, perr := pc.Prepare(ctx, "", q.SQL, nil)
			var pe *pgconn.PgError
			if errors.As(perr, &pe) {
				return &statementError{what: p.what, pos: pos[i], sql: q.SQL, err: perr}
			}
			if perr != nil {
				break
			}
		}
	}
	if !withFence {
		return &statementError{what: p.what, err: err}
	}
	return err
}

// next counts a statement of the handler's and returns its position.
func (p *Pipe) next() int {
	p.n++
	return p.n
}

// queued returns sql queued at position pos with a callback that names it in its error.
func (p *Pipe) queued(pos int, sql string, args []any) *pgx.QueuedQuery {
	q := &pgx.QueuedQuery{SQL: sql, Arguments: args}
	what := p.what
	q.Fn = func(br pgx.BatchResults) error {
		if _, err := br.Exec(); err != nil {
			return &statementError{what: what, pos: pos, sql: sql, err: err}
		}
		return nil
	}
	return q
}

// statementError is the failure of the handler's statements: the position in the
// transaction and the SQL of the one that failed (0 and "" when it is not known which), and
// the server's error, which errors.Is and errors.As find.
type statementError struct {
	what string
	pos  int
	sql  string
	err  error
}

func (e *statementError) Error() string {
	if e.pos == 0 {
		return fmt.Sprintf("%s: the handler's queued statements: %v", e.what, e.err)
	}
	return fmt.Sprintf("%s: statement %d of the transaction (%s): %v", e.what, e.pos, Shorten(e.sql), e.err)
}

func (e *statementError) Unwrap() error { return e.err }

// Statement returns the SQL of the handler's statement that failed, "" if it is not known
// which: the error is the handler's statements', not the fence store's.
func (e *statementError) Statement() string { return e.sql }

// Permanent reports whether the server refused the statement for its data: see
// [PermanentCode]. The consumer reads it (consumer.IsPermanent), the way a handler marks an
// error it sees itself: it applies the batch one record at a time and dead-letters the record
// that fails alone. A handler does not see the error of a queued statement in time to mark it.
func (e *statementError) Permanent() bool { return permanentErr(e.err) }

// Fence returns err, the fence statement's own failure, marked never permanent (a
// Permanent() bool method that returns false), whatever its SQLSTATE: [Classify] leaves it
// alone.
func Fence(err error) error {
	if err == nil {
		return nil
	}
	return &fenceError{err: err}
}

type fenceError struct{ err error }

func (e *fenceError) Error() string   { return e.err.Error() }
func (e *fenceError) Unwrap() error   { return e.err }
func (e *fenceError) Permanent() bool { return false }

// PermanentCode reports whether a statement refused with SQLSTATE code fails the same way
// when the same batch is sent again: class 22 (data exception) or 23 (integrity constraint
// violation), but a foreign key's (23503), a unique constraint's (23505) and an exclusion
// constraint's (23P01), which a concurrent writer can cause and a retry can pass.
func PermanentCode(code string) bool {
	if len(code) != 5 {
		return false
	}
	switch code {
	case "23503", "23505", "23P01":
		return false
	}
	return code[:2] == "22" || code[:2] == "23"
}

func permanentErr(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && PermanentCode(pe.Code)
}

// Classify returns err, an error of Apply's from the handler's statements or the commit,
// marked permanent (a Permanent() bool method that returns true) when the server refused a
// statement for its data ([PermanentCode]), however the statement was sent. It leaves alone
// the fence's verdicts and own errors, errors already marked (a Permanent method, true or
// false) and errors that hold no *pgconn.PgError.
func Classify(err error) error {
	if err == nil || Refused(err) {
		return err
	}
	var p interface{ Permanent() bool }
	if errors.As(err, &p) || !permanentErr(err) {
		return err
	}
	return &permanentError{err: err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string   { return e.err.Error() }
func (e *permanentError) Unwrap() error   { return e.err }
func (e *permanentError) Permanent() bool { return true }

// Shorten returns sql on one line, at most 60 bytes of it.
func Shorten(sql string) string {
	s := strings.Join(strings.Fields(sql), " ")
	if len(s) > 60 {
		s = s[:57] + "..."
	}
	return s
}

func (p *Pipe) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if p.flushing.Load() {
		return pgconn.CommandTag{}, p.busy()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return pgconn.CommandTag{}, p.err
	}
	if len(args) == 0 || isMode(args[0]) {
		p.direct = true
	}
	if p.direct {
		if err := p.send(ctx, nil, 0); err != nil {
			return pgconn.CommandTag{}, err
		}
		p.next()
		return p.Tx.Exec(ctx, sql, args...)
	}
	pos := p.next()
	q := p.queued(pos, sql, args)
	if p.advance != nil { // the first statement: with the fence, at once
		return pgconn.CommandTag{}, p.send(ctx, []*pgx.QueuedQuery{q}, pos)
	}
	p.queue, p.pos = append(p.queue, q), append(p.pos, pos)
	return pgconn.CommandTag{}, nil
}

func isMode(a any) bool {
	_, ok := a.(pgx.QueryExecMode)
	return ok
}

func (p *Pipe) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if p.flushing.Load() {
		return errRows{p.busy()}, p.busy()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.send(ctx, nil, 0); err != nil {
		return errRows{err}, err
	}
	p.next()
	return p.Tx.Query(ctx, sql, args...)
}

func (p *Pipe) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if p.flushing.Load() {
		return errRow{p.busy()}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.send(ctx, nil, 0); err != nil {
		return errRow{err}
	}
	p.next()
	return p.Tx.QueryRow(ctx, sql, args...)
}

// SendBatch sends the queued statements, then b. With fuse and the fence not sent yet, the
// three travel as one batch and b's results reach its QueuedQuery callbacks only: the
// returned pgx.BatchResults reports the batch's first error from Close.
func (p *Pipe) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if p.flushing.Load() {
		return errResults{what: p.what, err: p.busy()}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return errResults{what: p.what, err: p.err}
	}
	if p.fuse && p.advance != nil {
		at := p.n + 1
		p.n += len(b.QueuedQueries)
		return errResults{what: p.what, err: p.send(ctx, b.QueuedQueries, at)}
	}
	if err := p.send(ctx, nil, 0); err != nil {
		return errResults{what: p.what, err: err}
	}
	p.n += len(b.QueuedQueries)
	return p.Tx.SendBatch(ctx, b)
}

func (p *Pipe) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if p.flushing.Load() {
		return 0, p.busy()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.send(ctx, nil, 0); err != nil {
		return 0, err
	}
	p.next()
	return p.Tx.CopyFrom(ctx, table, cols, src)
}

func (p *Pipe) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if p.flushing.Load() {
		return nil, p.busy()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.send(ctx, nil, 0); err != nil {
		return nil, err
	}
	return p.Tx.Prepare(ctx, name, sql)
}

// Begin flushes, then begins a savepoint: from then on every statement runs at once.
func (p *Pipe) Begin(ctx context.Context) (pgx.Tx, error) {
	if p.flushing.Load() {
		return nil, p.busy()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.direct = true
	if err := p.send(ctx, nil, 0); err != nil {
		return nil, err
	}
	return p.Tx.Begin(ctx)
}

// LargeObjects flushes with Apply's context, then returns the large objects: from then on
// every statement runs at once.
func (p *Pipe) LargeObjects() pgx.LargeObjects {
	if p.flushing.Load() {
		return p.Tx.LargeObjects() // inside a flush: as it is, nothing sent (the connection is busy)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.direct = true
	if err := p.send(p.ctx, nil, 0); err != nil {
		p.abort() // a failure is sticky: the next call and Apply return it
	}
	return p.Tx.LargeObjects()
}

// Conn flushes with Apply's context, then returns the connection: from then on every
// statement runs at once, in the order the handler issues it on either.
func (p *Pipe) Conn() *pgx.Conn {
	if p.flushing.Load() {
		return p.Tx.Conn() // inside a flush: as it is, nothing sent (the connection is busy)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.direct = true
	if err := p.send(p.ctx, nil, 0); err != nil {
		p.abort() // a failure is sticky: the next call and Apply return it
	}
	return p.Tx.Conn()
}

// busy is the error of a call made while a flush is under way: from a QueuedQuery callback of
// the batch being sent, or from another goroutine (a transaction is not for concurrent use).
func (p *Pipe) busy() error {
	return fmt.Errorf("%s: the transaction is busy sending its queued statements (a call from a batch callback, or from another goroutine)", p.what)
}

// abort leaves the transaction failed after a failed flush (a refused fence leaves it usable:
// the refusal was read in it), so a statement the handler then runs on the raw connection or
// large objects fails too and nothing it does in the transaction succeeds.
func (p *Pipe) abort() {
	_, _ = p.Tx.Exec(p.ctx, `DO $$BEGIN RAISE EXCEPTION 'the transaction failed: its fence refused it or a statement failed'; END$$`)
}

// Commit flushes and commits only if every statement succeeded (and the fence admitted them).
func (p *Pipe) Commit(ctx context.Context) error {
	if p.flushing.Load() {
		return p.busy()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.send(ctx, nil, 0); err != nil {
		return err
	}
	return p.Tx.Commit(ctx)
}

func (p *Pipe) Rollback(ctx context.Context) error {
	if p.flushing.Load() {
		return p.busy()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.queue, p.pos = nil, nil
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
