package pgbulk_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/fence/pgfence/pgbulk"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

const upsertKV = `INSERT INTO kv (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = excluded.v`

// pipeSink returns a Sink on a fresh schema with a table kv (k, v) whose CHECK refuses the
// value "fail", the counter of its round trips, and a key claimed under epoch 5, whose
// epoch 4 is stale.
func pipeSink(t *testing.T) (*pgbulk.Sink, *counter, func(k string) (string, bool), fence.Key) {
	t.Helper()
	_, schema := testenv.Postgres(t)
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
	if _, err := pool.Exec(ctx, `CREATE TABLE kv (k text PRIMARY KEY, v text NOT NULL CHECK (v <> 'fail'))`); err != nil {
		t.Fatal(err)
	}
	sink, err := pgbulk.NewSink(s, pool)
	if err != nil {
		t.Fatal(err)
	}
	k := fence.Key{Group: "g", Topic: "t", Partition: 1}
	if _, err := sink.Claim(ctx, k, fence.Token{Epoch: 5}, "test"); err != nil {
		t.Fatal(err)
	}
	read := func(key string) (string, bool) {
		var v string
		err := pool.QueryRow(context.Background(), `SELECT v FROM kv WHERE k = $1`, key).Scan(&v)
		if errors.Is(err, pgx.ErrNoRows) {
			return "", false
		}
		if err != nil {
			t.Fatal(err)
		}
		return v, true
	}
	c.take()
	return sink, c, read, k
}

// The first Exec travels with the fence statement, at once (a zombie's handler stops there);
// the statements after it are queued and travel in one batch: begin, batch, batch, commit.
func TestSinkPipelinesExec(t *testing.T) {
	sink, c, read, k := pipeSink(t)
	ctx := testenv.Context(t, 30*time.Second)
	err := sink.Apply(ctx, k, fence.Token{Epoch: 5}, 0, 2, func(ctx context.Context, tx pgx.Tx) error {
		for _, v := range []string{"1", "2", "3"} {
			if _, err := tx.Exec(ctx, upsertKV, "k", v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.take(); len(got) != 4 || got[0] != "begin" || got[1] != "batch" || got[2] != "batch" || got[3] != "commit" {
		t.Errorf("Apply of three Execs sent %q, want begin, batch (the fence and the first), batch (the other two), commit", got)
	}
	if v, _ := read("k"); v != "3" {
		t.Errorf("kv k = %q, want 3 (the last of the queued writes)", v)
	}
}

// A zombie's batch whose statements are queued behind the fence statement commits nothing:
// the fence's refusal wins, whether the handler returns nil or the error it read.
func TestSinkZombieQueuedStatementsCommitNothing(t *testing.T) {
	sink, _, read, k := pipeSink(t)
	ctx := testenv.Context(t, 30*time.Second)
	for _, failing := range []bool{false, true} {
		err := sink.Apply(ctx, k, fence.Token{Epoch: 4}, 0, 0, func(ctx context.Context, tx pgx.Tx) error {
			v := "zombie"
			if failing {
				v = "fail" // a statement that fails too, behind the refused fence
			}
			_, err := tx.Exec(ctx, upsertKV, "z", v)
			return err
		})
		var stale *fence.StaleError
		if !errors.As(err, &stale) {
			t.Errorf("zombie batch (a failing statement too: %v): Apply = %v, want the fence's *fence.StaleError", failing, err)
		}
		if v, ok := read("z"); ok {
			t.Fatalf("kv z = %q: a zombie's queued write committed", v)
		}
	}
}

// After the fence refused (the handler reads, and ignores the refusal), what the handler
// queues next is never sent, and Apply fails with the refusal.
func TestSinkStatementsAfterARefusedFenceNeverCommit(t *testing.T) {
	sink, _, read, k := pipeSink(t)
	ctx := testenv.Context(t, 30*time.Second)
	var readErr error
	err := sink.Apply(ctx, k, fence.Token{Epoch: 4}, 0, 0, func(ctx context.Context, tx pgx.Tx) error {
		var n int
		readErr = tx.QueryRow(ctx, `SELECT count(*) FROM kv`).Scan(&n)
		_, _ = tx.Exec(ctx, upsertKV, "after", "x")
		return nil
	})
	var stale *fence.StaleError
	if !errors.As(readErr, &stale) {
		t.Errorf("the read that sent the fence = %v, want its refusal", readErr)
	}
	if !errors.As(err, &stale) {
		t.Errorf("Apply = %v, want the fence's refusal, whatever the handler returned", err)
	}
	if v, ok := read("after"); ok {
		t.Fatalf("kv after = %q: a statement queued after a refused fence committed", v)
	}
}

// A queued statement that fails fails Apply with the server's error, named, and nothing
// commits; a handler that fails before anything was sent still gets the fence's refusal
// reported over its own error.
func TestSinkQueuedFailureAndHandlerError(t *testing.T) {
	sink, _, read, k := pipeSink(t)
	ctx := testenv.Context(t, 30*time.Second)
	err := sink.Apply(ctx, k, fence.Token{Epoch: 5}, 0, 0, func(ctx context.Context, tx pgx.Tx) error {
		_, _ = tx.Exec(ctx, upsertKV, "a", "1")
		_, _ = tx.Exec(ctx, upsertKV, "b", "fail")
		return nil
	})
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "23514" {
		t.Fatalf("Apply = %v, want the check violation of statement 2", err)
	}
	if _, ok := read("a"); ok {
		t.Error("kv a committed though a later statement of its transaction failed")
	}
	failed := errors.New("handler failed")
	err = sink.Apply(ctx, k, fence.Token{Epoch: 4}, 0, 0, func(ctx context.Context, tx pgx.Tx) error {
		_, _ = tx.Exec(ctx, upsertKV, "z", "1")
		return failed
	})
	if !errors.Is(err, fence.ErrStale) {
		t.Errorf("a zombie's handler failing before anything was sent: Apply = %v, want the fence's refusal", err)
	}
}
