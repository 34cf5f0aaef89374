package pgbulk_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/fence/pgfence/pgbulk"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// A QueuedQuery callback may use the transaction it was queued on the way pgx allows (its
// Conn, for the type map, say): the batch sent with the fence runs its callbacks, and Apply
// returns rather than hang. The sink runs on a connection of its own, left open if Apply
// hangs, so that the test fails instead of waiting for it at cleanup.
func TestSinkBatchCallbackMayUseTheTransaction(t *testing.T) {
	_, schema := testenv.Postgres(t)
	ctx := testenv.Context(t, 30*time.Second)
	pool := schemaPool(t, schema, nil)
	s, err := pgfence.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE kv (k text PRIMARY KEY, v text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgx.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["search_path"] = schema
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	sink, err := pgbulk.NewSink(s, conn)
	if err != nil {
		t.Fatal(err)
	}
	k := fence.Key{Group: "g", Topic: "t", Partition: 1}
	if _, err := sink.Claim(ctx, k, fence.Token{Epoch: 5}, "test"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- sink.Apply(ctx, k, fence.Token{Epoch: 5}, 0, 0, func(ctx context.Context, tx pgx.Tx) error {
			b := &pgx.Batch{}
			b.Queue(upsertKV, "a", "1").Exec(func(pgconn.CommandTag) error {
				_ = tx.Conn().TypeMap() // legal in pgx: Conn only returns the connection
				return nil
			})
			return tx.SendBatch(ctx, b).Close()
		})
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Apply = %v, want nil", err)
		}
		_ = conn.Close(context.Background())
	case <-time.After(10 * time.Second):
		t.Fatal("Apply hung: a QueuedQuery callback of the batch sent with the fence called the transaction's Conn")
	}
}
