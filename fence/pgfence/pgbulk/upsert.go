package pgbulk

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/batonhq/baton/internal/bulk"
	"github.com/batonhq/baton/internal/sqlident"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// defaultRowsPerStatement is how many rows one statement carries unless [RowsPerStatement]
// says otherwise.
const defaultRowsPerStatement = 1000

// Column is one column written by an [Upsert]: its name and its PostgreSQL type, as written
// in a cast ("text", "bigint", "timestamptz", "numeric(12,2)").
type Column struct {
	Name string
	Type string
}

// Option configures an [Upsert].
type Option func(*config) error

type config = bulk.Config

// Merge folds rows with the same key into one before they are sent: merge(into, row) is
// called, in order, for every row whose key an earlier row of the same call already had, with
// into that earlier (already merged) row. It must update into in place; the key columns must
// stay as they are. Without Merge, repeated keys are written in layers (see the package doc).
func Merge(merge func(into, row []any)) Option { return bulk.MergeOption("pgbulk", merge) }

// RowsPerStatement bounds the rows of one statement (default 1000: large enough to amortize
// a statement's overhead, small enough to keep arrays and plans cheap).
func RowsPerStatement(n int) Option { return bulk.RowsOption("pgbulk", n) }

// Upsert writes rows into one table with set-based INSERT ... ON CONFLICT statements. It is
// immutable and safe for concurrent use.
type Upsert struct {
	cols  []Column
	spec  bulk.Spec
	sql   string
	table string
	key   []string
}

// NewUpsert returns the upsert of cols into table with the conflict target key (column
// names, all among cols; a unique index must cover them). set is the DO UPDATE SET clause,
// in which the table is aliased t and the new row is excluded, as in "n = t.n + excluded.n";
// an empty set means every non-key column takes the new row's value (DO NOTHING when there is
// none). table may be schema-qualified. NewUpsert validates everything and reports every
// problem at once; it does no I/O.
func NewUpsert(table string, key []string, cols []Column, set string, opts ...Option) (*Upsert, error) {
	u := &Upsert{cols: slices.Clone(cols), table: table, key: slices.Clone(key)}
	var errs []error
	u.spec, errs = bulk.New("pgbulk", table, key, bulk.Columns(cols), false, defaultRowsPerStatement, keyNorm, opts)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	u.sql = u.statement(table, key, set)
	return u, nil
}

func (u *Upsert) statement(table string, key []string, set string) string {
	arrays := make([]string, len(u.cols))
	for i, c := range u.cols {
		arrays[i] = fmt.Sprintf("$%d::%s[]", i+1, c.Type)
	}
	return fmt.Sprintf("INSERT INTO %s AS t (%s) SELECT * FROM unnest(%s) %s",
		sqlident.Quote(table), strings.Join(u.spec.Names, ", "), strings.Join(arrays, ", "), u.spec.OnConflict(key, set))
}

// BatchSender is what [Upsert.Exec] writes through: a pgx.Tx, a *pgx.Conn or a *pgxpool.Pool.
type BatchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Exec writes rows (each one value per column, in the order of the columns) in one round
// trip: rows merged per key (with [Merge]) or split into layers of distinct keys (without),
// in statements of at most [RowsPerStatement] rows, sent as one batch. Run it inside a
// transaction (the one a consumer handler gets), so that the rows land all or none. It
// fails, sending nothing, if a row has the wrong number of values. Rows are not modified
// (Merge works on copies). Keys are compared by their values in the database where Go can
// know them (see the package doc); two keys equal only under the database's equality (a
// collation, numeric text) reach one statement, which PostgreSQL refuses: Exec then fails
// with a permanent error (consumer.IsPermanent) that names the table and the likely keys
// and wraps PostgreSQL's.
func (u *Upsert) Exec(ctx context.Context, tx BatchSender, rows [][]any) error {
	var b pgx.Batch
	if err := u.queue(&b, rows); err != nil {
		return err
	}
	if b.Len() == 0 {
		return nil
	}
	return tx.SendBatch(ctx, &b).Close()
}

// queue queues the statements that write rows to b, each with a callback that turns
// PostgreSQL's refusal of one key written twice into the permanent error Exec documents. It
// fails, queueing nothing, if a row has the wrong number of values. Rows are not modified
// (Merge works on copies).
func (u *Upsert) queue(b *pgx.Batch, rows [][]any) error {
	layers, err := u.spec.Layers("pgbulk", rows, len(u.cols))
	if err != nil {
		return err
	}
	for _, layer := range layers {
		for len(layer) > 0 {
			n := min(len(layer), u.spec.Cfg.Rows)
			stmt := layer[:n]
			b.Queue(u.sql, u.arrays(stmt)...).Fn = func(br pgx.BatchResults) error {
				_, err := br.Exec()
				return u.keyError(stmt, err)
			}
			layer = layer[n:]
		}
	}
	return nil
}

// keyError returns err, or the *bulk.KeyError for it if it is PostgreSQL's refusal of a
// statement that affected one row twice.
func (u *Upsert) keyError(rows [][]any, err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "21000" ||
		(pe.Routine != "" && pe.Routine != "ExecOnConflictUpdate") { // not a subquery of the SET clause
		return err // 21000: cardinality_violation
	}
	return &bulk.KeyError{Pkg: "pgbulk", Table: u.table, Cols: u.key, Likely: bulk.LikelyPair(rows, u.spec.Key),
		Rows: len(rows), Err: err}
}

// keyNorm is the normalisation of a key column's values by its declared type: the bytes of
// a []byte and of a string are one value whatever the type (pgx sends both as they are);
// time.Time as pgx encodes it, to the microsecond, by type: an instant for timestamptz, the
// wall clock (its zone dropped) for timestamp, the calendar day for date.
func keyNorm(c bulk.Column) bulk.Norm {
	var t func(time.Time) time.Time
	switch baseType(c.Type) {
	case "timestamptz", "timestamp with time zone":
		t = func(v time.Time) time.Time { return v.UTC().Truncate(time.Microsecond) }
	case "timestamp", "timestamp without time zone":
		t = func(v time.Time) time.Time {
			return time.Date(v.Year(), v.Month(), v.Day(), v.Hour(), v.Minute(), v.Second(), v.Nanosecond(), time.UTC).Truncate(time.Microsecond)
		}
	case "date":
		t = func(v time.Time) time.Time { return time.Date(v.Year(), v.Month(), v.Day(), 0, 0, 0, 0, time.UTC) }
	}
	return func(v any) any {
		if x, ok := v.(time.Time); ok && t != nil {
			return t(x)
		}
		return bulk.BytesAsString(v)
	}
}

// baseType is a declared type without its modifiers, lower case: "timestamptz(3)" is
// "timestamptz".
func baseType(typ string) string {
	for {
		open := strings.IndexByte(typ, '(')
		end := strings.IndexByte(typ, ')')
		if open < 0 || end < open {
			break
		}
		typ = typ[:open] + typ[end+1:]
	}
	return strings.ToLower(strings.Join(strings.Fields(typ), " "))
}

// arrays returns one array argument per column.
func (u *Upsert) arrays(rows [][]any) []any {
	args := make([]any, len(u.cols))
	for c := range u.cols {
		args[c] = column(rows, c)
	}
	return args
}

// column returns column c of rows as a typed slice when every value has the same type, so
// that pgx encodes it without reflection; otherwise as []any.
func column(rows [][]any, c int) any {
	switch rows[0][c].(type) {
	case string:
		return typed[string](rows, c)
	case int64:
		return typed[int64](rows, c)
	case int32:
		return typed[int32](rows, c)
	case int:
		return typed[int](rows, c)
	case float64:
		return typed[float64](rows, c)
	case bool:
		return typed[bool](rows, c)
	case []byte:
		return typed[[]byte](rows, c)
	case time.Time:
		return typed[time.Time](rows, c)
	}
	return anyColumn(rows, c)
}

func typed[T any](rows [][]any, c int) any {
	out := make([]T, len(rows))
	for i, r := range rows {
		v, ok := r[c].(T)
		if !ok {
			return anyColumn(rows, c)
		}
		out[i] = v
	}
	return out
}

func anyColumn(rows [][]any, c int) []any {
	out := make([]any, len(rows))
	for i, r := range rows {
		out[i] = r[c]
	}
	return out
}
