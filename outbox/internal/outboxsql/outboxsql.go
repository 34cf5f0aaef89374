// Package outboxsql is what the SQL outbox stores (pgoutbox, sqliteoutbox) share: their
// options and table names, and the statements whose logic is the same in every dialect (the
// fence check that explains a refusal, the pending read, the fenced mark, the dead-letter list,
// the backlog). Each store writes its own SQL and its own append and dead-letter paths; this
// package runs the shared statements through the store's driver and classifies their results
// alike.
package outboxsql

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/sqlident"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/internal/outboxstore"
)

const (
	cursorsSuffix = "_cursors"
	deadSuffix    = "_dead_letters"
)

// Config is what a store's options set.
type Config struct {
	table, fences string
	maxBytes      int
	prop          propagation.TextMapPropagator
}

// Table sets the outbox table name.
func Table(name string) func(*Config) error {
	return func(c *Config) error { c.table = name; return nil }
}

// MaxMessageBytes bounds each message's key+value+headers.
func MaxMessageBytes(n int) func(*Config) error {
	return func(c *Config) error {
		if n < 1 {
			return fmt.Errorf("%w: MaxMessageBytes %d", outbox.ErrInvalid, n)
		}
		c.maxBytes = n
		return nil
	}
}

// Setup is a store's validated configuration.
type Setup struct {
	// Outbox, Cursors, Dead and Fences are the table names as configured.
	Outbox, Cursors, Dead, Fences string
	MaxBytes                      int
	Prop                          propagation.TextMapPropagator
	// Replacer puts the quoted names in place of {{outbox}}, {{cursors}}, {{deadletters}} and
	// {{fences}}.
	Replacer *strings.Replacer
}

// Configure applies opts over the defaults (table, fences) and validates the table names. A
// nil DB (noDB), a nil option and every invalid value are reported, joined, each wrapping
// outbox.ErrInvalid; what (the store's name) prefixes the messages.
func Configure[O ~func(*Config) error](what string, noDB bool, table, fences string, opts []O) (Setup, error) {
	var errs []error
	if noDB {
		errs = append(errs, fmt.Errorf("%w: %s: nil DB", outbox.ErrInvalid, what))
	}
	c := Config{table: table, fences: fences, maxBytes: outboxstore.DefaultMaxMessageBytes, prop: propagation.TraceContext{}}
	for i, o := range opts {
		if o == nil {
			errs = append(errs, fmt.Errorf("%w: %s: option %d is nil", outbox.ErrInvalid, what, i))
			continue
		}
		if err := o(&c); err != nil {
			errs = append(errs, err)
		}
	}
	cursors, dead := c.table+cursorsSuffix, c.table+deadSuffix
	for _, n := range []string{c.table, cursors, dead, c.fences} {
		if err := sqlident.Validate(n); err != nil {
			errs = append(errs, fmt.Errorf("%w: %s: table name: %w", outbox.ErrInvalid, what, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Setup{}, err
	}
	return Setup{
		Outbox: c.table, Cursors: cursors, Dead: dead, Fences: c.fences,
		MaxBytes: c.maxBytes, Prop: c.prop,
		Replacer: strings.NewReplacer("{{outbox}}", sqlident.Quote(c.table), "{{cursors}}", sqlident.Quote(cursors),
			"{{deadletters}}", sqlident.Quote(dead), "{{fences}}", sqlident.Quote(c.fences)),
	}, nil
}

// Row is one result row: pgx.Row or *sql.Row.
type Row interface {
	Scan(dest ...any) error
}

// Rows is a result set: pgx.Rows or *sql.Rows.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// Statements are the shared statements in the store's dialect. Their parameters:
//
//   - Fence: group, topic, partition; selects era, epoch of the fence row.
//   - Pending: group, topic, partition, era, epoch, limit; selects seq, era, epoch,
//     dest_topic, msg_key, msg_value, headers, idempotency_key, traceparent, tracestate,
//     created at, of the pending rows in sequence order while the fence stores the token.
//   - Mark: group, topic, partition, era, epoch, through; the fenced move of the delivered
//     cursor, returning the backlog after it, or no row.
//   - DeadList: group, topic, partition, limit; selects Pending's columns then reason,
//     by_era, by_epoch, dead at.
//   - Backlog: group, topic, partition; selects last_seq - delivered_seq.
type Statements struct {
	Fence, Pending, Mark, DeadList, Backlog string
}

// Core runs the shared statements through one driver: R and RS are its row and result set.
type Core[R Row, RS Rows] struct {
	What      string // the store's name, prefixing errors
	NoRows    error  // the driver's error for a query that returned no row
	UnixNanos bool   // timestamps are stored as Unix nanoseconds, not as timestamps
	QueryRow  func(ctx context.Context, sql string, args ...any) R
	Query     func(ctx context.Context, sql string, args ...any) (RS, error)
	Close     func(RS)
	SQL       Statements
}

// Check returns nil if src's fence stores exactly tok, and otherwise the error a fenced
// statement that matched nothing reports. q reads: the store's database, or the transaction
// the refused statement ran in.
func (c *Core[R, RS]) Check(ctx context.Context, q func(context.Context, string, ...any) R, src fence.Key, tok fence.Token) error {
	var stored fence.Token
	err := q(ctx, c.SQL.Fence, src.Group, src.Topic, src.Partition).Scan(&stored.Era, &stored.Epoch)
	switch {
	case errors.Is(err, c.NoRows):
		return fmt.Errorf("%w: %s has no fence row; claim it first", outbox.ErrUnfenced, src)
	case err != nil:
		return fmt.Errorf("%s: reading the fence of %s: %w", c.What, src, err)
	case tok.Compare(stored) < 0:
		return &fence.StaleError{Key: src, Stored: stored, Presented: tok}
	case tok == stored:
		return nil
	}
	return fmt.Errorf("%w: %s stores %s, presented %s", outbox.ErrUnfenced, src, stored, tok)
}

// timeDest returns where a stored time is scanned to: t itself, or ns for Unix nanoseconds.
func (c *Core[R, RS]) timeDest(t *time.Time, ns *int64) any {
	if c.UnixNanos {
		return ns
	}
	return t
}

// setTime sets t from ns when the time was scanned as Unix nanoseconds.
func (c *Core[R, RS]) setTime(t *time.Time, ns int64) {
	if c.UnixNanos {
		*t = time.Unix(0, ns)
	}
}

// row finishes a scanned row: decodes its headers and derives an idempotency key not stored
// (a function of source and sequence, which the row holds).
func row(r *outbox.Row, hs []byte) error {
	var err error
	if r.Headers, err = outboxstore.UnmarshalHeaders(hs); err != nil {
		return err
	}
	if r.IdempotencyKey == "" {
		r.IdempotencyKey = outboxstore.IdempotencyKey(r.Source, r.Seq)
	}
	return nil
}

// Pending implements outbox.Store.Pending.
func (c *Core[R, RS]) Pending(ctx context.Context, src fence.Key, tok fence.Token, limit int) ([]outbox.Row, error) {
	rows, err := c.Query(ctx, c.SQL.Pending, src.Group, src.Topic, src.Partition, tok.Era, tok.Epoch, limit)
	if err != nil {
		return nil, fmt.Errorf("%s: pending of %s: %w", c.What, src, err)
	}
	defer c.Close(rows)
	var out []outbox.Row
	for rows.Next() {
		r := outbox.Row{Source: src}
		var hs []byte
		var created int64
		if err := rows.Scan(&r.Seq, &r.Token.Era, &r.Token.Epoch, &r.Topic, &r.Key, &r.Value, &hs,
			&r.IdempotencyKey, &r.TraceParent, &r.TraceState, c.timeDest(&r.CreatedAt, &created)); err != nil {
			return nil, fmt.Errorf("%s: pending of %s: %w", c.What, src, err)
		}
		c.setTime(&r.CreatedAt, created)
		if err := row(&r, hs); err != nil {
			return nil, fmt.Errorf("%s: %s seq %d: %w", c.What, src, r.Seq, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: pending of %s: %w", c.What, src, err)
	}
	if len(out) == 0 {
		// Nothing pending, or the fence moved on: tell a zombie so.
		if err := c.Check(ctx, c.QueryRow, src, tok); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// MarkDelivered implements outbox.Store.MarkDelivered with the Mark statement.
func (c *Core[R, RS]) MarkDelivered(ctx context.Context, src fence.Key, tok fence.Token, through int64) (int64, error) {
	var backlog int64
	err := c.QueryRow(ctx, c.SQL.Mark, src.Group, src.Topic, src.Partition, tok.Era, tok.Epoch, through).Scan(&backlog)
	if errors.Is(err, c.NoRows) {
		if err := c.Check(ctx, c.QueryRow, src, tok); err != nil {
			return 0, err
		}
		return 0, fmt.Errorf("%w: %s: seq %d was never allocated", outbox.ErrInvalid, src, through)
	}
	if err != nil {
		return 0, fmt.Errorf("%s: marking %s delivered through %d: %w", c.What, src, through, err)
	}
	return backlog, nil
}

// NotFirstPending explains a dead-letter statement that matched no row, read with q (the
// store's database, or the transaction it ran in): the fence's refusal, or else seq is not the
// first pending row.
func (c *Core[R, RS]) NotFirstPending(ctx context.Context, q func(context.Context, string, ...any) R, src fence.Key, tok fence.Token, seq int64) error {
	if err := c.Check(ctx, q, src, tok); err != nil {
		return err
	}
	return fmt.Errorf("%w: %s: seq %d is not the first pending row", outbox.ErrInvalid, src, seq)
}

// DeadLetters returns up to limit dead-lettered rows of src in sequence order.
func (c *Core[R, RS]) DeadLetters(ctx context.Context, src fence.Key, limit int) ([]outbox.DeadRow, error) {
	rows, err := c.Query(ctx, c.SQL.DeadList, src.Group, src.Topic, src.Partition, limit)
	if err != nil {
		return nil, fmt.Errorf("%s: dead letters of %s: %w", c.What, src, err)
	}
	defer c.Close(rows)
	var out []outbox.DeadRow
	for rows.Next() {
		d := outbox.DeadRow{Row: outbox.Row{Source: src}}
		var hs []byte
		var created, at int64
		if err := rows.Scan(&d.Seq, &d.Token.Era, &d.Token.Epoch, &d.Topic, &d.Key, &d.Value, &hs, &d.IdempotencyKey,
			&d.TraceParent, &d.TraceState, c.timeDest(&d.CreatedAt, &created), &d.Reason, &d.By.Era, &d.By.Epoch,
			c.timeDest(&d.At, &at)); err != nil {
			return nil, fmt.Errorf("%s: dead letters of %s: %w", c.What, src, err)
		}
		c.setTime(&d.CreatedAt, created)
		c.setTime(&d.At, at)
		if err := row(&d.Row, hs); err != nil {
			return nil, fmt.Errorf("%s: dead letter %s seq %d: %w", c.What, src, d.Seq, err)
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: dead letters of %s: %w", c.What, src, err)
	}
	return out, nil
}

// Backlog returns how many rows of src are appended and not yet delivered.
func (c *Core[R, RS]) Backlog(ctx context.Context, src fence.Key) (int64, error) {
	var n int64
	err := c.QueryRow(ctx, c.SQL.Backlog, src.Group, src.Topic, src.Partition).Scan(&n)
	if errors.Is(err, c.NoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("%s: backlog of %s: %w", c.What, src, err)
	}
	return n, nil
}

// CheckRetention refuses a negative Cleanup retention.
func CheckRetention(olderThan time.Duration) error {
	if olderThan < 0 {
		return fmt.Errorf("%w: negative retention %s", outbox.ErrInvalid, olderThan)
	}
	return nil
}
