package pgbulk_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/fencetest"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/fence/pgfence/pgbulk"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// writeKV is the conformance suite's user write, sent as a batch so that every Apply of the
// suite goes through the pipelined path (fence statement first in the same batch).
func writeKV(ctx context.Context, tx pgx.Tx, k, v string) error {
	var b pgx.Batch
	b.Queue(`INSERT INTO kv (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = excluded.v`, k, v)
	return tx.SendBatch(ctx, &b).Close()
}

// TestConformance runs the fence conformance suite on the pipelined Sink: it is a fence.Sink
// like any other.
func TestConformance(t *testing.T) {
	fencetest.Run(t, func(t *testing.T) fencetest.Env[pgx.Tx] {
		pool, schema := testenv.Postgres(t)
		ctx := testenv.Context(t, time.Minute)
		s, err := pgfence.New(pool)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `CREATE TABLE kv (k text PRIMARY KEY, v text NOT NULL CHECK (v <> 'fail'))`); err != nil {
			t.Fatal(err)
		}
		return env(t, pool, schema)
	})
}

func env(t testing.TB, pool *pgxpool.Pool, schema string) fencetest.Env[pgx.Tx] {
	s, err := pgfence.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	sink, err := pgbulk.NewSink(s, pool)
	if err != nil {
		t.Fatal(err)
	}
	return fencetest.Env[pgx.Tx]{
		Sink:  sink,
		Keyed: s,
		Write: writeKV,
		Read: func(ctx context.Context, k string) (string, bool, error) {
			var v string
			err := pool.QueryRow(ctx, `SELECT v FROM kv WHERE k = $1`, k).Scan(&v)
			if errors.Is(err, pgx.ErrNoRows) {
				return "", false, nil
			}
			return v, err == nil, err
		},
		Reopen: func(t testing.TB) fencetest.Env[pgx.Tx] {
			pool.Close()
			p := schemaPool(t, schema, nil)
			return env(t, p, schema)
		},
		Begin: func(ctx context.Context) (pgx.Tx, func() error, func() error, error) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return nil, nil, nil, err
			}
			rollback := func() error {
				rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				return tx.Rollback(rctx)
			}
			return tx, func() error { return tx.Commit(ctx) }, rollback, nil
		},
	}
}

func schemaPool(t testing.TB, schema string, tracer pgx.QueryTracer) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.ConnConfig.Tracer = tracer
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// counter counts the round trips a connection makes: queries and batches sent.
type counter struct {
	mu   sync.Mutex
	sent []string
}

func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sent = append(c.sent, d.SQL)
	return ctx
}
func (c *counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *counter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sent = append(c.sent, "batch")
	return ctx
}
func (c *counter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *counter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

func (c *counter) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sent
	c.sent = nil
	return s
}

// TestSinkPipelinesTheFence: an Apply whose handler writes with Upsert.Exec costs begin, one
// batch and commit; pgfence's own Apply one more (the fence statement). A refused fence
// fails Apply with its verdict and leaves nothing written, even when the handler ignores
// the batch's error.
func TestSinkPipelinesTheFence(t *testing.T) {
	admin, schema := testenv.Postgres(t)
	ctx := testenv.Context(t, 30*time.Second)
	c := &counter{}
	pool := schemaPool(t, schema, c)
	s, err := pgfence.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `CREATE TABLE kv (key text PRIMARY KEY, n bigint, total bigint, first bigint, last bigint, bad bigint)`); err != nil {
		t.Fatal(err)
	}
	up, err := pgbulk.NewUpsert("kv", []string{"key"}, foldCols, foldSet, pgbulk.Merge(mergeFold))
	if err != nil {
		t.Fatal(err)
	}
	sink, err := pgbulk.NewSink(s, pool)
	if err != nil {
		t.Fatal(err)
	}
	k := fence.Key{Group: "g", Topic: "t", Partition: 3}
	cur, old := fence.Token{Epoch: 5}, fence.Token{Epoch: 4}
	if _, err := sink.Claim(ctx, k, cur, "test"); err != nil {
		t.Fatal(err)
	}
	write := func(fs fence.Sink[pgx.Tx], tok fence.Token, pos, v int64, ignore bool) error {
		return fs.Apply(ctx, k, tok, pos, pos, func(ctx context.Context, tx pgx.Tx) error {
			err := up.Exec(ctx, tx, [][]any{foldRow("a", v), foldRow("b", v)})
			if ignore {
				return nil
			}
			return err
		})
	}
	c.take()
	if err := write(sink, cur, 10, 1, false); err != nil {
		t.Fatal(err)
	}
	if got := c.take(); len(got) != 3 || got[0] != "begin" || got[1] != "batch" || got[2] != "commit" {
		t.Errorf("pipelined Apply sent %q, want begin, batch, commit", got)
	}
	if err := write(s, cur, 11, 2, false); err != nil {
		t.Fatal(err)
	}
	if got := c.take(); len(got) != 4 {
		t.Errorf("pgfence's Apply sent %q: want 4 round trips (the fence its own)", got)
	}
	for _, ignore := range []bool{false, true} {
		if err := write(sink, old, 20, 3, ignore); !errors.Is(err, fence.ErrStale) {
			t.Errorf("stale token (handler ignores errors: %v): %v, want ErrStale", ignore, err)
		}
		if err := write(sink, cur, 11, 3, ignore); !errors.Is(err, fence.ErrDuplicate) {
			t.Errorf("applied position (handler ignores errors: %v): %v, want ErrDuplicate", ignore, err)
		}
	}
	var n, last int64
	if err := admin.QueryRow(ctx, `SELECT n, last FROM kv WHERE key = 'a'`).Scan(&n, &last); err != nil {
		t.Fatal(err)
	}
	if n != 2 || last != 2 {
		t.Errorf("after two applied and four refused batches: n=%d last=%d, want 2 and 2", n, last)
	}
	// A handler that writes with Exec first, or not at all, still advances the fence.
	err = sink.Apply(ctx, k, cur, 12, 12, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SELECT 1`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sink.Apply(ctx, k, cur, 13, 13, func(context.Context, pgx.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	st, err := sink.Load(ctx, k)
	if err != nil || st.Position != 13 {
		t.Errorf("position %d (%v), want 13", st.Position, err)
	}
	// A caller's statement that fails is the caller's error, and nothing commits.
	err = sink.Apply(ctx, k, cur, 14, 14, func(ctx context.Context, tx pgx.Tx) error {
		var b pgx.Batch
		b.Queue(`INSERT INTO kv (key) VALUES (NULL)`) // the primary key is NOT NULL
		return tx.SendBatch(ctx, &b).Close()
	})
	if err == nil || !strings.Contains(err.Error(), "null value") {
		t.Errorf("a failing statement: %v", err)
	}
	if st, _ := sink.Load(ctx, k); st.Position != 13 {
		t.Errorf("a failed batch moved the position to %d", st.Position)
	}
}
