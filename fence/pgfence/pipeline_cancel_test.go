package pgfence

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/batonhq/baton/internal/testkit/testenv"
)

// Apply's context bounds every statement of the handler's transaction: a queued statement
// waiting for a row lock is cancelled with it, whichever call of the handler sends it
// (Conn and LargeObjects take no context).
func TestApplyContextBoundsAQueuedStatementsLockWait(t *testing.T) {
	s, pool := newStore(t)
	bg := testenv.Context(t, 30*time.Second)
	k, tok := claimed(t, s)
	if _, err := pool.Exec(bg, upsertKV, "k", "held"); err != nil {
		t.Fatal(err)
	}
	holder, err := pool.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(bg, `SELECT 1 FROM kv WHERE k = 'k' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	const held = 5 * time.Second
	release := time.AfterFunc(held, func() { _ = holder.Rollback(context.Background()) })
	defer release.Stop()
	defer func() { _ = holder.Rollback(context.Background()) }()
	for _, call := range []string{"Conn", "LargeObjects"} {
		ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
		start := time.Now()
		_ = s.Apply(ctx, k, tok, 0, 0, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, upsertKV, "k", "mine"); err != nil {
				return err
			}
			switch call {
			case "Conn":
				_ = tx.Conn()
			case "LargeObjects":
				_ = tx.LargeObjects()
			}
			return nil
		})
		cancel()
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("%s: Apply with a 300ms context returned after %v: the queued statement's lock wait outlived the context", call, took.Round(time.Millisecond))
			break // the lock was released meanwhile: the next call cannot wait
		}
	}
}
