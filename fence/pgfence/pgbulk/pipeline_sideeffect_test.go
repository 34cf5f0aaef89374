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

// A handler that writes, and only once its write succeeded calls an external service (a
// payment API, a produce), never makes that call under a refused fence: the write's success
// must mean the fence admitted the batch.
func TestSinkZombieHandlerStopsAtItsFirstWrite(t *testing.T) {
	sink, _, _, k := pipeSink(t)
	ctx := testenv.Context(t, 30*time.Second)
	called := false
	err := sink.Apply(ctx, k, fence.Token{Epoch: 4}, 0, 0, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, upsertKV, "order", "charged"); err != nil {
			return err
		}
		called = true // the external call, made once the write succeeded
		return nil
	})
	if !errors.Is(err, fence.ErrStale) {
		t.Errorf("Apply under a stale token = %v, want the fence's refusal", err)
	}
	if called {
		t.Error("a zombie's handler reached its external call: its Exec succeeded under a refused fence")
	}
}
