package sqlitefence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
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

type versionedConfig struct{ key, version string }

// VersionedOption configures a [Versioned]. Invalid values make [NewVersioned] fail.
type VersionedOption func(*versionedConfig) error

// KeyColumn names the column that identifies a record (default "id"). It must carry a unique
// constraint (a primary key will do): creating a record relies on ON CONFLICT on it.
func KeyColumn(name string) VersionedOption {
	return func(c *versionedConfig) error { c.key = name; return nil }
}

// VersionColumn names the integer column that holds a record's version (default "version").
// Only [Versioned.Write] should write it: a writer that sets it by hand can make a stale
// writer's version match again.
func VersionColumn(name string) VersionedOption {
	return func(c *versionedConfig) error { c.version = name; return nil }
}

// Versioned is optimistic concurrency control on one of the caller's tables in SQLite (the
// seeds' OCC pattern): Write sets a record's columns only if its version column still holds
// the version the caller read, and increments it, in one statement:
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
	c := versionedConfig{key: DefaultKeyColumn, version: DefaultVersionColumn}
	var errs []error
	for i, o := range opts {
		if o == nil {
			errs = append(errs, fmt.Errorf("%w: sqlitefence: versioned option %d is nil", fence.ErrInvalid, i))
			continue
		}
		if err := o(&c); err != nil {
			errs = append(errs, err)
		}
	}
	t, err := occsql.New("sqlitefence", table, c.key, c.version)
	if err := errors.Join(append(errs, err)...); err != nil {
		return nil, err
	}
	return &Versioned{t: t}, nil
}

// sqlitePlaceholder numbers the parameters (?1, ?2, ...): the statements bind them out of
// textual order.
func sqlitePlaceholder(i int) string { return "?" + strconv.Itoa(i) }

// Write sets the columns of record id if its version is expected, and raises the version to
// expected+1 in the same statement; expected 0 creates the record at version 1 (INSERT ... ON
// CONFLICT DO NOTHING). It returns the new version. A stale version, a missing record or an
// existing one (for a create) fails with a *fence.VersionConflictError whose Found is the
// stored version (0: no record), and writes nothing. Bad arguments fail with fence.ErrInvalid
// before any statement runs; a database busy past its timeout fails with [ErrBusy]. In a
// transaction (q a *sql.Tx) the write commits or rolls back with it, and the version read
// to classify a refusal is the one that refused; on a *sql.DB it commits on its own.
func (v *Versioned) Write(ctx context.Context, q RowQuerier, id any, expected int64, set ...fence.Column) (int64, error) {
	if err := v.t.Check(id, expected, set); err != nil {
		return 0, err
	}
	if q == nil {
		return 0, fmt.Errorf("%w: sqlitefence: versioned write to %s: nil querier", fence.ErrInvalid, v.t.Name())
	}
	var query string
	var args []any
	if expected == 0 {
		query, args = v.t.Insert(sqlitePlaceholder, id, set)
	} else {
		query, args = v.t.Update(sqlitePlaceholder, id, expected, set)
	}
	// A refusal whose re-read finds the expected version can only come from a record created
	// between the two statements, on a q outside a transaction; re-running the write decides.
	for attempt := 1; ; attempt++ {
		var version int64
		err := q.QueryRowContext(ctx, query, args...).Scan(&version)
		if err == nil {
			return version, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return 0, fmt.Errorf("sqlitefence: versioned write to %s: %w", v.t.Name(), wrapBusy(err))
		}
		var found int64
		switch err := q.QueryRowContext(ctx, v.t.Select(sqlitePlaceholder), id).Scan(&found); {
		case errors.Is(err, sql.ErrNoRows):
			found = 0
		case err != nil:
			return 0, fmt.Errorf("sqlitefence: versioned write to %s: refused; reading the stored version: %w", v.t.Name(), wrapBusy(err))
		}
		if found != expected || attempt == conflictRetries {
			return 0, v.t.Conflict(id, expected, found)
		}
	}
}

// conflictRetries bounds the re-runs of a refused write whose re-read found the expected version.
const conflictRetries = 3
