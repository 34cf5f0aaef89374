package fence

import (
	"context"
	"fmt"
)

// VersionConflictError means an optimistic [Versioned] write lost: the record's stored version
// was not the version the writer read (another writer wrote it since), the record to update
// does not exist, or the record to create exists already. Nothing was written. It carries the
// version the writer expected and the version the store found; find it with errors.As.
// Retrying the same write cannot succeed: reread the record and decide again, or give up.
type VersionConflictError struct {
	Table    string // the versioned table, as configured
	ID       any    // the record's key, as passed to Write
	Expected int64  // the version the writer presented; 0 asked to create the record
	Found    int64  // the stored version read after the refusal; 0 if the record does not exist
}

func (e *VersionConflictError) Error() string {
	switch {
	case e.Expected == 0:
		return fmt.Sprintf("fence: version conflict on %s %v: create refused, the record exists at version %d", e.Table, e.ID, e.Found)
	case e.Found == 0:
		return fmt.Sprintf("fence: version conflict on %s %v: expected version %d, the record does not exist", e.Table, e.ID, e.Expected)
	}
	return fmt.Sprintf("fence: version conflict on %s %v: expected version %d, found %d", e.Table, e.ID, e.Expected, e.Found)
}

// Column is one column a [Versioned] write sets: its name and its new value, passed to the
// driver as a bound parameter.
type Column struct {
	Name  string
	Value any
}

// Versioned is optimistic concurrency control on one table: a single-record conditional write
// whose version column is compared and incremented in the same statement, so that a writer
// that read version v can write only if nobody wrote since. The version plays the part of a
// fencing token that the record itself carries: a paused writer wakes up with the version it
// read, the record has moved on, and its write matches nothing. No lock, lease or clock is
// involved, and none is needed when the critical section is one read-modify-write of one
// record. pgfence.NewVersioned and sqlitefence.NewVersioned return it over the caller's own table;
// Tx is the store's transaction type (pgx.Tx, *sql.Tx).
//
// The write runs in the caller's transaction, so it composes with a fenced [Sink.Apply] (both
// checks hold) or with the caller's other writes; a rollback discards it.
type Versioned[Tx any] interface {
	// Write sets the columns of record id if its stored version equals expected, and raises
	// the version to expected+1 in the same statement; expected 0 creates the record at
	// version 1 instead. It returns the new version. A stored version other than expected, a
	// missing record (expected > 0) or an existing one (expected 0) fails with a
	// *VersionConflictError and writes nothing. A negative expected version, no columns, a
	// column named twice, a column that is the key or the version column, an invalid column
	// name or a nil id fail with an error wrapping [ErrInvalid] before any statement runs.
	Write(ctx context.Context, tx Tx, id any, expected int64, set ...Column) (version int64, err error)
}
