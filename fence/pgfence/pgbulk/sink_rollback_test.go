package pgbulk_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/fence/pgfence/pgbulk"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// The fence advances lazily, at the handler's first statement, in the handler's own
// transaction: whichever way the handler writes (Exec, QueryRow, CopyFrom, or nothing), a
// handler that then fails rolls back its writes and the fence's advance together. A fence
// advanced in a transaction of its own would commit while the data rolls back, and the
// batch's records would be skipped as applied.
func TestSinkRollsBackTheLazyAdvanceWithTheData(t *testing.T) {
	admin, schema := testenv.Postgres(t)
	ctx := testenv.Context(t, 30*time.Second)
	pool := schemaPool(t, schema, nil)
	s, err := pgfence.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s.kv (k text PRIMARY KEY, v text NOT NULL)`, pgx.Identifier{schema}.Sanitize())); err != nil {
		t.Fatal(err)
	}
	sink, err := pgbulk.NewSink(s, pool)
	if err != nil {
		t.Fatal(err)
	}
	k := fence.Key{Group: "g", Topic: "t", Partition: 0}
	tok := fence.Token{Epoch: 1}
	if _, err := sink.Claim(ctx, k, tok, "test"); err != nil {
		t.Fatal(err)
	}
	failed := errors.New("the handler failed after writing")
	writes := map[string]func(ctx context.Context, tx pgx.Tx, key string) error{
		"Exec": func(ctx context.Context, tx pgx.Tx, key string) error {
			_, err := tx.Exec(ctx, `INSERT INTO kv (k, v) VALUES ($1, 'x')`, key)
			return err
		},
		"QueryRow": func(ctx context.Context, tx pgx.Tx, key string) error {
			var got string
			return tx.QueryRow(ctx, `INSERT INTO kv (k, v) VALUES ($1, 'x') RETURNING k`, key).Scan(&got)
		},
		"CopyFrom": func(ctx context.Context, tx pgx.Tx, key string) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{"kv"}, []string{"k", "v"}, pgx.CopyFromRows([][]any{{key, "x"}}))
			return err
		},
	}
	pos := int64(0)
	for _, how := range []string{"Exec", "QueryRow", "CopyFrom"} {
		before, err := sink.Load(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		pos++
		err = sink.Apply(ctx, k, tok, pos, pos, func(ctx context.Context, tx pgx.Tx) error {
			if err := writes[how](ctx, tx, how); err != nil {
				return err
			}
			return failed
		})
		if !errors.Is(err, failed) {
			t.Fatalf("%s: Apply = %v, want the handler's error", how, err)
		}
		after, err := sink.Load(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		var n int
		if err := admin.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s.kv WHERE k = $1`, pgx.Identifier{schema}.Sanitize()), how).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if after.Position != before.Position {
			t.Errorf("written through %s, then failed: the fence committed at position %d while the data rolled back (%d rows; position before %d)", how, after.Position, n, before.Position)
		}
		if n != 0 {
			t.Errorf("written through %s, then failed: %d rows committed", how, n)
		}
		// The batch is applied when tried again, through the same method.
		if err := sink.Apply(ctx, k, tok, pos, pos, func(ctx context.Context, tx pgx.Tx) error { return writes[how](ctx, tx, how) }); err != nil {
			t.Fatalf("%s: the retried batch: %v", how, err)
		}
	}
}
