package sqlitefence

import (
	"context"
	"database/sql"
	"strconv"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/occsql"
)

// NewVersioned returns optimistic concurrency control on one of the caller's tables in
// SQLite: table ("name" or "schema.name", schema being an attached database), whose column key
// identifies a record (it must carry a unique constraint, a primary key will do: creating a
// record relies on ON CONFLICT on it) and whose INTEGER NOT NULL column version holds the
// record's version (usually "id" and "version"). Only the writer should write the version
// column: a writer that sets it by hand can make a stale writer's version match again. Write
// sets a record's columns only if its version column still holds the version the caller read,
// and increments it, in one statement:
//
//	UPDATE "work_order" SET "status" = ?3, "version" = "version" + 1
//	 WHERE "id" = ?1 AND "version" = ?2 RETURNING "version"
//
// Expected version 0 creates the record at version 1 instead (INSERT ... ON CONFLICT DO
// NOTHING). A writer that read version 12 and was paused while another wrote version 13
// matches no row and gets a *fence.VersionConflictError (Expected 12, Found 13, the stored
// version; 0: no record), and writes nothing. SQLite runs one write transaction at a time, so
// the compare and the increment can never interleave with another writer's; with [Open]'s
// settings (BEGIN IMMEDIATE) a transaction holds the write lock from its start, and a write in
// it waits for the lock up to the busy timeout, failing with [ErrBusy] past it. The write runs
// in the caller's *sql.Tx and commits or rolls back with it.
//
// The caller creates the table and reads records with its own SELECT, version included. Names
// are validated and always quoted, as for [Store]. NewVersioned does no I/O; an invalid name
// fails with errors wrapping fence.ErrInvalid, all of them joined. The writer passes the
// fencetest OCC suite.
func NewVersioned(table, key, version string) (fence.Versioned[*sql.Tx], error) {
	t, err := occsql.Open(dialect, table, key, version)
	if err != nil {
		return nil, err
	}
	return versioned{t: t}, nil
}

// dialect numbers the parameters (?1, ?2, ...): the statements bind them out of textual
// order.
var dialect = occsql.Dialect{
	What:        "sqlitefence",
	Placeholder: func(i int) string { return "?" + strconv.Itoa(i) },
	NoRows:      sql.ErrNoRows,
	Wrap:        wrapBusy,
}

type versioned struct{ t occsql.Table }

// Write implements fence.Versioned; a nil tx fails with fence.ErrInvalid.
func (v versioned) Write(ctx context.Context, tx *sql.Tx, id any, expected int64, set ...fence.Column) (int64, error) {
	var queryRow func(context.Context, string, ...any) *sql.Row
	if tx != nil {
		queryRow = tx.QueryRowContext
	}
	return occsql.Write(ctx, v.t, queryRow, id, expected, set)
}
