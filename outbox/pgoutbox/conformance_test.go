package pgoutbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/outbox/outboxtest"
	"github.com/batonhq/baton/outbox/pgoutbox"
)

// TestConformance runs the outbox suite against a real PostgreSQL, a fresh schema per case
// (skipped without BATON_POSTGRES_URL, like the other tests here).
func TestConformance(t *testing.T) {
	outboxtest.Run(t, func(t *testing.T) outboxtest.Env[pgx.Tx] {
		pool, _ := testenv.Postgres(t)
		ctx := testenv.Context(t, time.Minute)
		fences, err := pgfence.New(pool)
		if err != nil {
			t.Fatal(err)
		}
		if err := fences.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		store, err := pgoutbox.New(pool, fences, pgoutbox.MaxMessageBytes(1000))
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		return outboxtest.Env[pgx.Tx]{
			Store:           store,
			Fences:          fences,
			MaxMessageBytes: 1000,
			Begin: func(ctx context.Context) (pgx.Tx, func() error, func() error, error) {
				tx, err := pool.Begin(ctx)
				if err != nil {
					return nil, nil, nil, err
				}
				commit := func() error { return tx.Commit(ctx) }
				// Not ctx: the suite rolls back in t.Cleanup, after the case's context ended.
				rollback := func() error {
					rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					return tx.Rollback(rctx)
				}
				return tx, commit, rollback, nil
			},
		}
	})
}
