package sqliteoutbox

import (
	"context"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/internal/outboxsql"
	"github.com/batonhq/baton/outbox/internal/outboxstore"
)

// defaultTable is the default outbox table name.
const defaultTable = "baton_outbox"

type config = outboxsql.Config

// Option configures [New].
type Option func(*config) error

// Table sets the outbox table name (default "baton_outbox"); the store also uses name+"_cursors"
// and name+"_dead_letters".
func Table(name string) Option { return outboxsql.Table(name) }

// MaxMessageBytes bounds each message's key+value+headers at Append (default 1000000: just
// under Kafka's default message.max.bytes less batch overhead). Keep it at or below the
// destination topics' max.message.bytes.
func MaxMessageBytes(n int) Option { return outboxsql.MaxMessageBytes(n) }

// Store is a transactional outbox in SQLite. It implements [outbox.Store]. Safe for concurrent use.
type Store struct {
	db       *sql.DB
	maxBytes int
	prop     propagation.TextMapPropagator
	schema   string

	core outboxsql.Core[*sql.Row, *sql.Rows] // the statements shared with pgoutbox

	allocSQL, insertSQL, deadMarkSQL, deadCopySQL, cleanupSQL string
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
	var db *sql.DB
	table, noFences := "baton_fences", error(nil)
	if fences == nil {
		noFences = fmt.Errorf("%w: sqliteoutbox: nil fence store", outbox.ErrInvalid)
	} else {
		db, table = fences.DB(), fences.Table()
	}
	c, err := outboxsql.Configure("sqliteoutbox", false, defaultTable, table, opts)
	if err := errors.Join(noFences, err); err != nil {
		return nil, err
	}
	r := c.Replacer
	s := &Store{db: db, maxBytes: c.MaxBytes, prop: c.Prop, schema: r.Replace(schemaSQL)}
	s.core = outboxsql.Core[*sql.Row, *sql.Rows]{What: "sqliteoutbox", NoRows: sql.ErrNoRows, UnixNanos: true,
		QueryRow: db.QueryRowContext, Query: db.QueryContext, Close: func(rows *sql.Rows) { _ = rows.Close() }}
	q := &s.core.SQL
	const holds = `EXISTS (SELECT 1 FROM {{fences}} f WHERE f.grp = ?1 AND f.topic = ?2 AND f.partition = ?3 AND f.era = ?4 AND f.epoch = ?5)`
	s.allocSQL = r.Replace(`INSERT INTO {{cursors}} AS c (grp, topic, partition, last_seq)
SELECT ?1, ?2, ?3, ?6 WHERE ` + holds + `
ON CONFLICT (grp, topic, partition) DO UPDATE SET last_seq = c.last_seq + excluded.last_seq
RETURNING last_seq`)
	s.insertSQL = r.Replace(`INSERT INTO {{outbox}} (grp, topic, partition, seq, era, epoch, dest_topic, msg_key, msg_value,
    headers, idempotency_key, traceparent, tracestate, created_ns) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
	q.Fence = r.Replace(`SELECT era, epoch FROM {{fences}} WHERE grp = ? AND topic = ? AND partition = ?`)
	// delivered_seq as a scalar subquery so the index range starts at the first pending row
	// (see pgoutbox: a join walked every delivered row kept until Cleanup).
	q.Pending = r.Replace(`SELECT o.seq, o.era, o.epoch, o.dest_topic, o.msg_key, o.msg_value, o.headers,
    o.idempotency_key, o.traceparent, o.tracestate, o.created_ns
FROM {{outbox}} o
WHERE o.grp = ?1 AND o.topic = ?2 AND o.partition = ?3
  AND o.seq > (SELECT c.delivered_seq FROM {{cursors}} c WHERE c.grp = ?1 AND c.topic = ?2 AND c.partition = ?3)
  AND ` + holds + `
ORDER BY o.seq LIMIT ?6`)
	q.Mark = r.Replace(`UPDATE {{cursors}} SET delivered_seq = max(delivered_seq, ?6)
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
	q.DeadList = r.Replace(`SELECT seq, era, epoch, dest_topic, msg_key, msg_value, headers, idempotency_key,
    traceparent, tracestate, created_ns, reason, by_era, by_epoch, dead_ns
FROM {{deadletters}} WHERE grp = ? AND topic = ? AND partition = ? ORDER BY seq LIMIT ?`)
	q.Backlog = r.Replace(`SELECT last_seq - delivered_seq FROM {{cursors}} WHERE grp = ? AND topic = ? AND partition = ?`)
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
		if err := s.core.Check(ctx, tx.QueryRowContext, src, tok); err != nil {
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
			ik = outboxstore.IdempotencyKey(src, seq)
		}
		if _, err := stmt.ExecContext(ctx, src.Group, src.Topic, src.Partition, seq, tok.Era, tok.Epoch,
			m.Topic, m.Key, m.Value, outboxstore.MarshalHeaders(m.Headers), ik, tp, ts, now); err != nil {
			return fmt.Errorf("sqliteoutbox: append to %s: %w", src, err)
		}
	}
	return nil
}

// Pending implements [outbox.Store].
func (s *Store) Pending(ctx context.Context, src fence.Key, tok fence.Token, limit int) ([]outbox.Row, error) {
	return s.core.Pending(ctx, src, tok, limit)
}

// MarkDelivered implements [outbox.Store] with one conditional UPDATE.
func (s *Store) MarkDelivered(ctx context.Context, src fence.Key, tok fence.Token, through int64) (int64, error) {
	return s.core.MarkDelivered(ctx, src, tok, through)
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
		return 0, s.core.NotFirstPending(ctx, tx.QueryRowContext, src, tok, seq)
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
	return s.core.DeadLetters(ctx, src, limit)
}

// Backlog returns how many rows of src are appended and not yet delivered.
func (s *Store) Backlog(ctx context.Context, src fence.Key) (int64, error) {
	return s.core.Backlog(ctx, src)
}

// Cleanup deletes delivered rows appended more than olderThan ago; undelivered rows are kept.
func (s *Store) Cleanup(ctx context.Context, olderThan time.Duration) (int64, error) {
	if err := outboxsql.CheckRetention(olderThan); err != nil {
		return 0, err
	}
	res, err := s.db.ExecContext(ctx, s.cleanupSQL, time.Now().Add(-olderThan).UnixNano())
	if err != nil {
		return 0, fmt.Errorf("sqliteoutbox: cleanup: %w", err)
	}
	return res.RowsAffected()
}
