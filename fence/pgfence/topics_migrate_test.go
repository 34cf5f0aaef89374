package pgfence

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestNotMigratedNamesTheFix(t *testing.T) {
	err := notMigrated(&pgconn.PgError{Code: "42P01", Message: `relation "baton_fences_topics" does not exist`})
	if !strings.Contains(err.Error(), "baton migrate") {
		t.Fatalf("%v: does not say to migrate", err)
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		t.Fatalf("%v: the database's error is not kept", err)
	}
	if other := errors.New("x"); notMigrated(other) != other {
		t.Fatal("another error changed")
	}
}
