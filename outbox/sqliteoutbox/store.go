package sqliteoutbox

import (
	"context"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/internal/sqlident"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/outboxstore"
)

// Defaults.
const (
	DefaultTable      = "baton_outbox"
	defaultFenceTable = sqlitefence.DefaultTable
	cursorsSuffix     = "_cursors"
	deadSuffix        = "_dead_letters"
)

type config struct {
	table, fences string
	maxBytes      int
	prop          propagation.TextMapPropagator
}

// Option configures [New].
type Option func(*config) error

// Table sets the outbox table name (default [DefaultTable]); the store also uses name+"_cursors"
// and name+"_dead_letters".
func Table(name string) Option { return func(c *config) error { c.table = name; return nil } }

// MaxMessageBytes bounds each message's key+value+headers (default outbox.DefaultMaxMessageBytes).
func MaxMessageBytes(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("%w: MaxMessageBytes %d", outbox.ErrInvalid, n)
		}
		c.maxBytes = n
		return nil
	}
}

// Propagator sets how Append captures the trace context (default propagation.TraceContext{}).
func Propagator(p propagation.TextMapPropagator) Option {
	return func(c *config) error {
		if p == nil {
			return fmt.Errorf("%w: nil propagator", outbox.ErrInvalid)
		}
		c.prop = p
		return nil
	}
}

// Store is a transactional outbox in SQLite. It implements [outbox.Store]. Safe for concurrent use.
type Store struct {
	db       *sql.DB
	maxBytes int
	prop     propagation.TextMapPropagator
	schema   string

	allocSQL, insertSQL, fenceSQL, pendingSQL, markSQL, deadMarkSQL, deadCopySQL, deadListSQL, backlogSQL, cleanupSQL string
}

var _ outbox.Store = (*Store)(nil)

//go:embed schema.sql
var schemaSQL string

// New returns a store next to fences, in its database (fences.DB()), whose appends are
// checked against fences' table (sqlitefence's, not created here). It does no I/O: call
// [Store.Migrate] to create the tables (or create them yourself from [Store.Schema]). A nil
// fences, a nil option or an invalid value fails with [outbox.ErrInvalid]; every problem is
// reported, joined with errors.Join.
func New(fences *sqlitefence.Store, opts ...Option) (*Store, error) {
	var errs []error
	var db *sql.DB
	c := config{table: DefaultTable, fences: defaultFenceTable, maxBytes: outbox.DefaultMaxMessageBytes, prop: propagation.TraceContext{}}
	if fences == nil {
		errs = append(errs, fmt.Errorf("%w: sqliteoutbox: nil fence store", outbox.ErrInvalid))
	} else {
		db, c.fences = fences.DB(), fences.Table()
	}
	for i, o := range opts {
		if o == nil {
			errs = append(errs, fmt.Errorf("%w: sqliteoutbox: option %d is nil", outbox.ErrInvalid, i))
			continue
		}
		if err := o(&c); err != nil {
			errs = append(errs, err)
		}
	}
	cursors, dead := c.table+cursorsSuffix, c.table+deadSuffix
	for _, n := range []string{c.table, cursors, dead, c.fences} {
		if err := sqlident.Validate(n); err != nil {
			errs = append(errs, fmt.Errorf("%w: sqliteoutbox: table name: %w", outbox.ErrInvalid, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	r := strings.NewReplacer("{{outbox}}", sqlident.Quote(c.table), "{{cursors}}", sqlident.Quote(cursors), "{{deadletters}}", sqlident.Quote(dead), "{{fences}}", sqlident.Quote(c.fences))
	s := &Store{db: db, maxBytes: c.maxBytes, prop: c.prop, schema: r.Replace(schemaSQL)}
	const holds = `EXISTS (SELECT 1 FROM {{fences}} f WHERE f.grp = ?1 AND f.topic = ?2 AND f.partition = ?3 AND f.era = ?4 AND f.epoch = ?5)`
	s.allocSQL = r.Replace(`INSERT INTO {{cursors}} AS c (grp, topic, partition, last_seq)
SELECT ?1, ?2, ?3, ?6 WHERE ` + holds + `
ON CONFLICT (grp, topic, partition) DO UPDATE SET last_seq = c.last_seq + excluded.last_seq
RETURNING last_seq`)
	s.insertSQL = r.Replace(`INSERT INTO {{outbox}} (grp, topic, partition, seq, era, epoch, dest_topic, msg_key, msg_value,
    headers, idempotency_key, traceparent, tracestate, created_ns) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
	s.fenceSQL = r.Replace(`SELECT era, epoch FROM {{fences}} WHERE grp = ? AND topic = ? AND partition = ?`)
	// delivered_seq as a scalar subquery so the index range starts at the first pending row
	// (see pgoutbox: a join walked every delivered row kept until Cleanup).
	s.pendingSQL = r.Replace(`SELECT o.seq, o.era, o.epoch, o.dest_topic, o.msg_key, o.msg_value, o.headers,
    o.idempotency_key, o.traceparent, o.tracestate, o.created_ns
FROM {{outbox}} o
WHERE o.grp = ?1 AND o.topic = ?2 AND o.partition = ?3
  AND o.seq > (SELECT c.delivered_seq FROM {{cursors}} c WHERE c.grp = ?1 AND c.topic = ?2 AND c.partition = ?3)
  AND ` + holds + `
ORDER BY o.seq LIMIT ?6`)
	s.markSQL = r.Replace(`UPDATE {{cursors}} SET delivered_seq = max(delivered_seq, ?6)
WHERE grp = ?1 AND topic = ?2 AND partition = ?3 AND ?6 <= last_seq AND ` + holds + `
RETURNING last_seq - delivered_seq`)
	// Dead-lettering: the fenced mark of exactly the first pending row (delivered_seq = seq-1,
	// the row exists), then, in the same transaction, the row's copy with the reason.
	s.deadMarkSQL = r.Replace(`UPDATE {{cursors}} SET delivered_seq = ?6
WHERE grp = ?1 AND topic = ?2 AND partition = ?3 AND delivered_seq = ?6 - 1 AND ?6 <= last_seq AND ` + holds + `
  AND EXISTS (SELECT 1 FROM {{outbox}} o WHERE o.grp = ?1 AND o.topic = ?2 AND o.partition = ?3 AND o.seq = ?6)
RETURNING last_seq - delivered_seq`)
	s.deadCopySQL = r.Replace(`INSERT INTO {{deadletters}} (grp, topic, partition, seq, era, epoch, dest_topic, msg_key, msg_value,
    headers, idempotency_key, traceparent, tracestate, created_ns, reason, by_era, by_epoch, dead_ns)
SELECT grp, topic, partition, seq, era, epoch, dest_topic, msg_key, msg_value, headers, idempotency_key,
    traceparent, tracestate, created_ns, ?5, ?6, ?7, ?8
FROM {{outbox}} WHERE grp = ?1 AND topic = ?2 AND partition = ?3 AND seq = ?4`)
	s.deadListSQL = r.Replace(`SELECT seq, era, epoch, dest_topic, msg_key, msg_value, headers, idempotency_key,
    traceparent, tracestate, created_ns, reason, by_era, by_epoch, dead_ns
FROM {{deadletters}} WHERE grp = ? AND topic = ? AND partition = ? ORDER BY seq LIMIT ?`)
	s.backlogSQL = r.Replace(`SELECT last_seq - delivered_seq FROM {{cursors}} WHERE grp = ? AND topic = ? AND partition = ?`)
	s.cleanupSQL = r.Replace(`DELETE FROM {{outbox}} WHERE created_ns < ?1 AND seq <= (SELECT c.delivered_seq FROM {{cursors}} c
    WHERE c.grp = {{outbox}}.grp AND c.topic = {{outbox}}.topic AND c.partition = {{outbox}}.partition)`)
	return s, nil
}

// Schema returns the DDL Migrate runs, with the configured table names, for users who manage
// migrations with their own tools.
func (s *Store) Schema() string { return s.schema }

// Migrate creates the outbox tables if they do not exist. It is idempotent and safe to call
// concurrently, from several processes too: the DDL runs in one write transaction, which
// SQLite serializes under its write lock.
func (s *Store) Migrate(ctx context.Context) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqliteoutbox: migrate: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // no-op after a commit
	if _, err := tx.ExecContext(ctx, s.schema); err != nil {
		return fmt.Errorf("sqliteoutbox: migrate: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqliteoutbox: migrate: commit: %w", err)
	}
	return nil
}

// Append adds msgs to src's outbox inside the caller's transaction tx, after the fence Advance
// of that transaction. Like pgoutbox.Store.Append it checks the fence itself: unless the fence
// stores exactly tok it writes nothing and fails with *fence.StaleError or
// [outbox.ErrUnfenced]; bad input fails before any statement. On any error roll tx back.
func (s *Store) Append(ctx context.Context, tx *sql.Tx, src fence.Key, tok fence.Token, msgs ...outbox.Message) error {
	if tx == nil {
		return fmt.Errorf("%w: nil transaction", outbox.ErrInvalid)
	}
	if err := outboxstore.ValidateAppend(src, tok, msgs, s.maxBytes); err != nil {
		return err
	}
	if len(msgs) == 0 {
		return nil
	}
	var last int64
	err := tx.QueryRowContext(ctx, s.allocSQL, src.Group, src.Topic, src.Partition, tok.Era, tok.Epoch, int64(len(msgs))).Scan(&last)
	if errors.Is(err, sql.ErrNoRows) {
		if err := s.check(ctx, tx, src, tok); err != nil {
			return err
		}
		return fmt.Errorf("sqliteoutbox: append to %s: no sequence allocated", src)
	}
	if err != nil {
		return fmt.Errorf("sqliteoutbox: append to %s: %w", src, err)
	}
	stmt, err := tx.PrepareContext(ctx, s.insertSQL)
	if err != nil {
		return fmt.Errorf("sqliteoutbox: append to %s: %w", src, err)
	}
	defer stmt.Close()
	tp, ts := outboxstore.TraceContext(ctx, s.prop)
	now := time.Now().UnixNano()
	first := last - int64(len(msgs)) + 1
	for i, m := range msgs {
		seq := first + int64(i)
		ik := m.IdempotencyKey
		if ik == "" {
			ik = outbox.IdempotencyKey(src, seq)
		}
		if _, err := stmt.ExecContext(ctx, src.Group, src.Topic, src.Partition, seq, tok.Era, tok.Epoch,
			m.Topic, m.Key, m.Value, outboxstore.MarshalHeaders(m.Headers), ik, tp, ts, now); err != nil {
			return fmt.Errorf("sqliteoutbox: append to %s: %w", src, err)
		}
	}
	return nil
}

type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// check returns nil if src's fence stores exactly tok, otherwise the refusal.
func (s *Store) check(ctx context.Context, q querier, src fence.Key, tok fence.Token) error {
	var stored fence.Token
	err := q.QueryRowContext(ctx, s.fenceSQL, src.Group, src.Topic, src.Partition).Scan(&stored.Era, &stored.Epoch)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("%w: %s has no fence row; claim it first", outbox.ErrUnfenced, src)
	case err != nil:
		return fmt.Errorf("sqliteoutbox: reading the fence of %s: %w", src, err)
	case tok.Less(stored):
		return &fence.StaleError{Key: src, Stored: stored, Presented: tok}
	case tok == stored:
		return nil
	}
	return fmt.Errorf("%w: %s stores %s, presented %s", outbox.ErrUnfenced, src, stored, tok)
}

// Pending implements [outbox.Store].
func (s *Store) Pending(ctx context.Context, src fence.Key, tok fence.Token, limit int) ([]outbox.Row, error) {
	rows, err := s.db.QueryContext(ctx, s.pendingSQL, src.Group, src.Topic, src.Partition, tok.Era, tok.Epoch, limit)
	if err != nil {
		return nil, fmt.Errorf("sqliteoutbox: pending of %s: %w", src, err)
	}
	defer rows.Close()
	var out []outbox.Row
	for rows.Next() {
		r := outbox.Row{Source: src}
		var hs []byte
		var ns int64
		if err := rows.Scan(&r.Seq, &r.Token.Era, &r.Token.Epoch, &r.Topic, &r.Key, &r.Value, &hs,
			&r.IdempotencyKey, &r.TraceParent, &r.TraceState, &ns); err != nil {
			return nil, fmt.Errorf("sqliteoutbox: pending of %s: %w", src, err)
		}
		r.CreatedAt = time.Unix(0, ns)
		if r.Headers, err = outboxstore.UnmarshalHeaders(hs); err != nil {
			return nil, fmt.Errorf("sqliteoutbox: %s seq %d: %w", src, r.Seq, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqliteoutbox: pending of %s: %w", src, err)
	}
	if len(out) == 0 {
		if err := s.check(ctx, s.db, src, tok); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// MarkDelivered implements [outbox.Store] with one conditional UPDATE.
func (s *Store) MarkDelivered(ctx context.Context, src fence.Key, tok fence.Token, through int64) (int64, error) {
	var backlog int64
	err := s.db.QueryRowContext(ctx, s.markSQL, src.Group, src.Topic, src.Partition, tok.Era, tok.Epoch, through).Scan(&backlog)
	if errors.Is(err, sql.ErrNoRows) {
		if err := s.check(ctx, s.db, src, tok); err != nil {
			return 0, err
		}
		return 0, fmt.Errorf("%w: %s: seq %d was never allocated", outbox.ErrInvalid, src, through)
	}
	if err != nil {
		return 0, fmt.Errorf("sqliteoutbox: marking %s delivered through %d: %w", src, through, err)
	}
	return backlog, nil
}

// DeadLetter implements [outbox.Store]: in one transaction, the fenced UPDATE of the cursor
// past seq (only if the fence stores exactly tok and seq is the first pending row) and the
// copy of the row, with reason and tok, into the dead-letter table (name+"_dead_letters").
func (s *Store) DeadLetter(ctx context.Context, src fence.Key, tok fence.Token, seq int64, reason string) (int64, error) {
	if err := outboxstore.ValidateDeadLetter(src, tok, seq, reason); err != nil {
		return 0, err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("sqliteoutbox: dead-lettering %s seq %d: %w", src, seq, err)
	}
	defer func() { _ = tx.Rollback() }() // no-op after a commit
	var backlog int64
	err = tx.QueryRowContext(ctx, s.deadMarkSQL, src.Group, src.Topic, src.Partition, tok.Era, tok.Epoch, seq).Scan(&backlog)
	if errors.Is(err, sql.ErrNoRows) {
		if err := s.check(ctx, tx, src, tok); err != nil {
			return 0, err
		}
		return 0, fmt.Errorf("%w: %s: seq %d is not the first pending row", outbox.ErrInvalid, src, seq)
	}
	if err != nil {
		return 0, fmt.Errorf("sqliteoutbox: dead-lettering %s seq %d: %w", src, seq, err)
	}
	res, err := tx.ExecContext(ctx, s.deadCopySQL, src.Group, src.Topic, src.Partition, seq, reason, tok.Era, tok.Epoch, time.Now().UnixNano())
	if err == nil {
		var n int64
		if n, err = res.RowsAffected(); err == nil && n != 1 {
			err = fmt.Errorf("copied %d rows", n)
		}
	}
	if err == nil {
		err = tx.Commit()
	}
	if err != nil {
		return 0, fmt.Errorf("sqliteoutbox: dead-lettering %s seq %d: %w", src, seq, err)
	}
	return backlog, nil
}

// DeadLetters returns up to limit dead-lettered rows of src in sequence order, for operators.
// It is not fenced: it only reads.
func (s *Store) DeadLetters(ctx context.Context, src fence.Key, limit int) ([]outbox.DeadRow, error) {
	rows, err := s.db.QueryContext(ctx, s.deadListSQL, src.Group, src.Topic, src.Partition, limit)
	if err != nil {
		return nil, fmt.Errorf("sqliteoutbox: dead letters of %s: %w", src, err)
	}
	defer rows.Close()
	var out []outbox.DeadRow
	for rows.Next() {
		d := outbox.DeadRow{Row: outbox.Row{Source: src}}
		var hs []byte
		var created, at int64
		if err := rows.Scan(&d.Seq, &d.Token.Era, &d.Token.Epoch, &d.Topic, &d.Key, &d.Value, &hs, &d.IdempotencyKey,
			&d.TraceParent, &d.TraceState, &created, &d.Reason, &d.By.Era, &d.By.Epoch, &at); err != nil {
			return nil, fmt.Errorf("sqliteoutbox: dead letters of %s: %w", src, err)
		}
		d.CreatedAt, d.At = time.Unix(0, created), time.Unix(0, at)
		if d.Headers, err = outboxstore.UnmarshalHeaders(hs); err != nil {
			return nil, fmt.Errorf("sqliteoutbox: dead letter %s seq %d: %w", src, d.Seq, err)
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqliteoutbox: dead letters of %s: %w", src, err)
	}
	return out, nil
}

// Backlog returns how many rows of src are appended and not yet delivered.
func (s *Store) Backlog(ctx context.Context, src fence.Key) (int64, error) {
	var n int64
	err := s.db.QueryRowContext(ctx, s.backlogSQL, src.Group, src.Topic, src.Partition).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("sqliteoutbox: backlog of %s: %w", src, err)
	}
	return n, nil
}

// Cleanup deletes delivered rows appended more than olderThan ago; undelivered rows are kept.
func (s *Store) Cleanup(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("%w: negative retention %s", outbox.ErrInvalid, olderThan)
	}
	res, err := s.db.ExecContext(ctx, s.cleanupSQL, time.Now().Add(-olderThan).UnixNano())
	if err != nil {
		return 0, fmt.Errorf("sqliteoutbox: cleanup: %w", err)
	}
	return res.RowsAffected()
}
