package pgoutbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/pgoutbox"
)

// An outbox over a fence store with a schema-qualified (or mixed-case) table checks tokens
// against exactly that table: the claimed token's append commits, an older token's is refused.
func TestCustomFenceTableFencesAppends(t *testing.T) {
	ctx := testenv.Context(t, 2*time.Minute)
	pool, _ := testenv.Postgres(t)
	schema := testenv.UniqueName("Fx") // mixed-case, and the test's own: the database is shared
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Logf("drop schema %s: %v", schema, err)
		}
	})
	for _, table := range []string{schema + ".Fences", "plain_fences"} {
		t.Run(table, func(t *testing.T) {
			fences, err := pgfence.New(pool, pgfence.Table(table))
			if err == nil {
				err = fences.Migrate(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			box, err := pgoutbox.New(pool, fences, pgoutbox.Table("ob_"+table[len(table)-6:]))
			if err == nil {
				err = box.Migrate(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			src := fence.Key{Group: "g", Topic: "t", Partition: 0}
			old, cur := fence.Token{Epoch: 1}, fence.Token{Epoch: 2}
			if _, err := fences.Claim(ctx, src, old, "a"); err != nil {
				t.Fatal(err)
			}
			msg := outbox.Message{Topic: "dest", Key: []byte("k"), Value: []byte("v")}
			if err := fences.Apply(ctx, src, old, 0, 0, func(ctx context.Context, tx pgx.Tx) error {
				return box.Append(ctx, tx, src, old, msg)
			}); err != nil {
				t.Fatalf("append under the claimed token: %v", err)
			}
			if _, err := fences.Claim(ctx, src, cur, "b"); err != nil {
				t.Fatal(err)
			}
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			err = box.Append(ctx, tx, src, old, msg)
			var se *fence.StaleError
			if !errors.As(err, &se) {
				t.Fatalf("append under the older token after a claim: %v, want a *fence.StaleError", err)
			}
		})
	}
}
