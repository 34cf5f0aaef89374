package consumer

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// handlerStatementError is an error of the handler's statement that the sink sent.
type handlerStatementError struct{ err error }

func (e *handlerStatementError) Error() string {
	return "statement 2 of the transaction: " + e.err.Error()
}
func (e *handlerStatementError) Unwrap() error     { return e.err }
func (e *handlerStatementError) Statement() string { return "INSERT INTO nosuch VALUES ($1)" }

// A missing table names baton migrate only when it is the sink's: not when the handler's own
// statement, sent by the sink, names a table that does not exist.
func TestTableMissingOnlyForTheSinksOwnStatements(t *testing.T) {
	missing := &pgconn.PgError{Code: "42P01", Message: `relation "nosuch" does not exist`}
	if !tableMissing(fmt.Errorf("pgfence: advance: %w", missing)) {
		t.Error("the fence's own missing table does not name baton migrate")
	}
	if tableMissing(fmt.Errorf("apply: %w", &handlerStatementError{err: missing})) {
		t.Error("the handler's statement on a missing table names baton migrate for the fence store")
	}
	if tableMissing(&handlerError{err: missing}) {
		t.Error("the handler's error names baton migrate for the fence store")
	}
}
