package pgfence

import (
	"context"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/occsql"
)

// NewVersioned returns optimistic concurrency control on one of the caller's tables in
// PostgreSQL: table ("name" or "schema.name"), whose column key identifies a record (it must
// carry a unique constraint, a primary key will do: creating a record relies on ON CONFLICT on
// it) and whose bigint NOT NULL column version holds the record's version (usually "id" and
// "version"). Only the writer should write the version column: a writer that sets it by hand
// can make a stale writer's version match again. Write sets a record's columns only if its
// version column still holds the version the caller read, and increments it, in one
// statement:
//
//	UPDATE "work_order" SET "status" = $3, "version" = "version" + 1
//	 WHERE "id" = $1 AND "version" = $2 RETURNING "version"
//
// Expected version 0 creates the record at version 1 instead (INSERT ... ON CONFLICT DO
// NOTHING). A writer that read version 12 and was paused while another wrote version 13
// matches no row and gets a *fence.VersionConflictError (Expected 12, Found 13, the version
// read right after the refusal; 0: no record), and writes nothing. Under READ COMMITTED the
// statement takes the row's lock before it re-evaluates its WHERE against the latest committed
// version, so of concurrent writers that read the same version exactly one succeeds; a loser
// waits for the winner's transaction and is then refused. Under REPEATABLE READ or
// SERIALIZABLE the loser fails with a serialization failure (SQLSTATE 40001) instead: still
// refused, but not as a conflict. The write runs in the caller's pgx.Tx and commits or rolls
// back with it (pgx.BeginFunc runs one on a pool).
//
// The caller creates the table and reads records with its own SELECT, version included. Names
// are validated and always quoted, as for [Store]. NewVersioned does no I/O; an invalid name
// fails with errors wrapping fence.ErrInvalid, all of them joined. The writer passes the
// fencetest OCC suite.
func NewVersioned(table, key, version string) (fence.Versioned[pgx.Tx], error) {
	t, err := occsql.Open(dialect, table, key, version)
	if err != nil {
		return nil, err
	}
	return versioned{t: t}, nil
}

var dialect = occsql.Dialect{
	What:        "pgfence",
	Placeholder: func(i int) string { return "$" + strconv.Itoa(i) },
	NoRows:      pgx.ErrNoRows,
}

type versioned struct{ t occsql.Table }

// Write implements fence.Versioned; a nil tx fails with fence.ErrInvalid.
func (v versioned) Write(ctx context.Context, tx pgx.Tx, id any, expected int64, set ...fence.Column) (int64, error) {
	var queryRow func(context.Context, string, ...any) pgx.Row
	if tx != nil {
		queryRow = tx.QueryRow
	}
	return occsql.Write(ctx, v.t, queryRow, id, expected, set)
}
