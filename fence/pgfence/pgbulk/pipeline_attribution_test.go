package pgbulk_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// A queued statement that the server refuses before executing anything (its table does not
// exist, so preparing it fails) is named as the handler's statement, by its position and SQL,
// as a statement that fails when it runs is; it is not reported as the fence's advance, which
// sends the operator to the fence store (a missing table of the store, baton migrate).
func TestSinkUnpreparableQueuedStatementIsNamed(t *testing.T) {
	sink, _, _, k := pipeSink(t)
	ctx := testenv.Context(t, 30*time.Second)
	handler := func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, upsertKV, "a", "1"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO nosuch VALUES ($1)`, 1)
		return err
	}
	for _, via := range []string{"pgbulk", "pgfence"} {
		var err error
		if via == "pgbulk" {
			err = sink.Apply(ctx, k, fence.Token{Epoch: 5}, 0, 0, handler)
		} else {
			err = sink.Store.Apply(ctx, k, fence.Token{Epoch: 5}, 0, 0, handler)
		}
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "42P01" {
			t.Fatalf("%s: Apply = %v, want the missing table's 42P01", via, err)
		}
		if strings.Contains(err.Error(), "advance") || !strings.Contains(err.Error(), "statement 2 of the transaction (INSERT INTO nosuch") {
			t.Errorf("%s: Apply = %v: want the handler's statement 2 named, not the fence's advance", via, err)
		}
	}
}
