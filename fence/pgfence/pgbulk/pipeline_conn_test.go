package pgbulk_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// A zombie's handler that writes through the transaction's connection (tx.Conn(), for a
// statement of its own protocol) and calls an external service once the write succeeded
// never makes the call: Conn sends the fence first, and a refused fence must fail the write,
// as it fails the first Exec on the transaction.
func TestSinkZombieHandlerStopsAtItsFirstWriteThroughConn(t *testing.T) {
	sink, _, _, k := pipeSink(t)
	ctx := testenv.Context(t, 30*time.Second)
	called := false
	err := sink.Apply(ctx, k, fence.Token{Epoch: 4}, 0, 0, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Conn().Exec(ctx, upsertKV, "order", "charged"); err != nil {
			return err
		}
		called = true // the external call, made once the write succeeded
		return nil
	})
	if !errors.Is(err, fence.ErrStale) {
		t.Errorf("Apply under a stale token = %v, want the fence's refusal", err)
	}
	if called {
		t.Error("a zombie's handler reached its external call: its write through Conn succeeded under a refused fence")
	}
}
