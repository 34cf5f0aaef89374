package sqlitefence

import (
	"context"
	"database/sql"
	"strconv"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/occsql"
)

// RowQuerier is what a [Versioned] write needs: *sql.Tx, *sql.DB and *sql.Conn all satisfy
// it.
type RowQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Default names of a versioned table's key and version columns.
const (
	DefaultKeyColumn     = occsql.DefaultKey
	DefaultVersionColumn = occsql.DefaultVersion
)

type versionedConfig = occsql.Config

// VersionedOption configures a [Versioned]. Invalid values make [NewVersioned] fail.
type VersionedOption func(*versionedConfig) error

// KeyColumn names the column that identifies a record (default "id"). It must carry a unique
// constraint (a primary key will do): creating a record relies on ON CONFLICT on it.
func KeyColumn(name string) VersionedOption { return occsql.KeyColumn(name) }

// VersionColumn names the integer column that holds a record's version (default "version").
// Only [Versioned.Write] should write it: a writer that sets it by hand can make a stale
// writer's version match again.
func VersionColumn(name string) VersionedOption { return occsql.VersionColumn(name) }

// Versioned is optimistic concurrency control on one of the caller's tables in SQLite: Write
// sets a record's columns only if its version column still holds the version the caller read,
// and increments it, in one statement:
//
//	UPDATE "work_order" SET "status" = ?3, "version" = "version" + 1
//	 WHERE "id" = ?1 AND "version" = ?2 RETURNING "version"
//
// A writer that read version 12 and was paused while another wrote version 13 matches no row
// and gets a *fence.VersionConflictError (Expected 12, Found 13). SQLite runs one write
// transaction at a time, so the compare and the increment can never interleave with another
// writer's; with [Open]'s settings (BEGIN IMMEDIATE) a transaction holds the write lock from
// its start, and a write in it waits for the lock up to the busy timeout, failing with
// [ErrBusy] past it.
//
// It is the table's owner: the caller creates the table (the key column unique, the version
// column INTEGER NOT NULL) and reads records with its own SELECT, version included. Names are
// validated (internal/sqlident) and always quoted, as for [Store]. It implements
// fence.Versioned[RowQuerier] and passes the fencetest OCC suite.
type Versioned struct {
	t occsql.Table
}

var _ fence.Versioned[RowQuerier] = (*Versioned)(nil)

// NewVersioned returns the optimistic writer of table ("name" or "schema.name", schema being
// an attached database). It does no I/O. A nil option or an invalid name fails with errors
// wrapping fence.ErrInvalid, all of them joined.
func NewVersioned(table string, opts ...VersionedOption) (*Versioned, error) {
	t, err := occsql.Open(dialect, table, opts)
	if err != nil {
		return nil, err
	}
	return &Versioned{t: t}, nil
}

// dialect numbers the parameters (?1, ?2, ...): the statements bind them out of textual
// order.
var dialect = occsql.Dialect{
	What:        "sqlitefence",
	Placeholder: func(i int) string { return "?" + strconv.Itoa(i) },
	NoRows:      sql.ErrNoRows,
	Wrap:        wrapBusy,
}

// Write sets the columns of record id if its version is expected, and raises the version to
// expected+1 in the same statement; expected 0 creates the record at version 1 (INSERT ... ON
// CONFLICT DO NOTHING). It returns the new version. A stale version, a missing record or an
// existing one (for a create) fails with a *fence.VersionConflictError whose Found is the
// stored version (0: no record), and writes nothing. Bad arguments fail with fence.ErrInvalid
// before any statement runs; a database busy past its timeout fails with [ErrBusy]. In a
// transaction (q a *sql.Tx) the write commits or rolls back with it, and the version read
// to classify a refusal is the one that refused; on a *sql.DB it commits on its own.
func (v *Versioned) Write(ctx context.Context, q RowQuerier, id any, expected int64, set ...fence.Column) (int64, error) {
	var queryRow func(context.Context, string, ...any) *sql.Row
	if q != nil {
		queryRow = q.QueryRowContext
	}
	return occsql.Write(ctx, v.t, queryRow, id, expected, set)
}
