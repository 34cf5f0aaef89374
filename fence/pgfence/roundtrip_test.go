package pgfence

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// counter is a pgx tracer counting the queries and batches a connection sends.
type counter struct {
	mu               sync.Mutex
	queries, batches int
	sql              []string
}

func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.queries++
	c.sql = append(c.sql, d.SQL)
	return ctx
}
func (c *counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *counter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.batches++
	return ctx
}
func (c *counter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *counter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

func (c *counter) take() (queries, batches int, sql []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	q, b, s := c.queries, c.batches, c.sql
	c.queries, c.batches, c.sql = 0, 0, nil
	return q, b, s
}

// The fence must not add a round trip to a batched write: ApplyBatch sends begin, one batch
// and commit, exactly what the same batch costs without a fence.
func TestApplyBatchAddsNoRoundTrip(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	_, _, schema := newStoreSchema(t) // creates kv and the fence tables in a fresh schema
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	c := &counter{}
	cfg.ConnConfig.Tracer = c
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := New(pool)
	if err != nil {
		t.Fatal(err)
	}
	k, tok := fence.Key{Group: "g", Topic: "t"}, fence.Token{Epoch: 1}
	if _, err := s.Claim(ctx, k, tok, "fencetest"); err != nil {
		t.Fatal(err)
	}
	queue := func(b *pgx.Batch) error {
		for _, key := range []string{"a", "b", "c"} {
			b.Queue(upsertKV, key, "v")
		}
		return nil
	}
	unfenced := func() error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		b := &pgx.Batch{}
		_ = queue(b)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	// Warm up the statement caches, then count.
	if err := unfenced(); err != nil {
		t.Fatal(err)
	}
	if err := s.ApplyBatch(ctx, k, tok, 1, 1, queue); err != nil {
		t.Fatal(err)
	}
	c.take()
	if err := unfenced(); err != nil {
		t.Fatal(err)
	}
	uq, ub, usql := c.take()
	if err := s.ApplyBatch(ctx, k, tok, 2, 2, queue); err != nil {
		t.Fatal(err)
	}
	fq, fb, fsql := c.take()
	if uq != 2 || ub != 1 || fq != uq || fb != ub {
		t.Fatalf("unfenced: %d queries %q and %d batches; fenced: %d queries %q and %d batches; want begin, one batch, commit for both",
			uq, usql, ub, fq, fsql, fb)
	}
}
