package pgbulk_test

import (
	"context"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/fence/pgfence/pgbulk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A consumer whose handler counts readings per device with the fast write path: each batch
// merged per device in Go, written by unnest statements of up to 1000 rows, sent with the
// fence statement in one round trip. Compiled, not run: it needs a broker and PostgreSQL
// (the bench runs this shape against both: 'baton bench', design baton-fast).
func ExampleNewSink() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	store, err := pgfence.New(pool)
	if err != nil {
		panic(err)
	}
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}
	sink, err := pgbulk.NewSink(store, pool)
	if err != nil {
		panic(err)
	}
	// CREATE TABLE readings (device text PRIMARY KEY, n bigint NOT NULL, last bytea)
	up, err := pgbulk.NewUpsert("readings", []string{"device"},
		[]pgbulk.Column{{Name: "device", Type: "text"}, {Name: "n", Type: "bigint"}, {Name: "last", Type: "bytea"}},
		"n = t.n + excluded.n, last = excluded.last",
		pgbulk.Merge(func(into, row []any) {
			into[1] = into[1].(int64) + row[1].(int64)
			into[2] = row[2]
		}))
	if err != nil {
		panic(err)
	}
	c, err := consumer.New("readings-counter", []string{"readings"}, fence.Sink[pgx.Tx](sink),
		nil, consumer.PerPartition(func(context.Context, fence.Key, fence.Token) (consumer.Handler[pgx.Tx], error) {
			return consumer.Handler[pgx.Tx](func(ctx context.Context, tx pgx.Tx, b *consumer.Batch) error {
				rows := make([][]any, len(b.Records))
				for i, r := range b.Records {
					rows[i] = []any{string(r.Key), int64(1), r.Value}
				}
				return up.Exec(ctx, tx, rows)
			}), nil
		}))
	if err != nil {
		panic(err)
	}
	_ = c.Run(ctx)
}
