package pgfence

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// claimed returns a key claimed under epoch 1 of era 0.
func claimed(t *testing.T, s *Store) (fence.Key, fence.Token) {
	t.Helper()
	k := fence.Key{Group: "g", Topic: "t", Partition: 0}
	tok := fence.Token{Epoch: 1}
	if _, err := s.Claim(context.Background(), k, tok, "test"); err != nil {
		t.Fatal(err)
	}
	return k, tok
}

// Exec in Apply's transaction queues: the statements reach the server, in order, before the
// commit, and a batch whose statements were queued is applied with them.
func TestApplyQueuedStatementsCommit(t *testing.T) {
	s, pool := newStore(t)
	ctx := testenv.Context(t, 30*time.Second)
	k, tok := claimed(t, s)
	err := s.Apply(ctx, k, tok, 0, 2, func(ctx context.Context, tx pgx.Tx) error {
		for _, v := range []string{"a", "b", "c"} {
			tag, err := tx.Exec(ctx, upsertKV, "k", v)
			if err != nil {
				return err
			}
			if tag.RowsAffected() != 0 {
				t.Errorf("Exec's tag %q: want the empty tag of a queued statement", tag)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if v, ok := readKV(t, pool, "k"); v != "c" {
		t.Fatalf("kv k = %q (present %v): the queued statements were not all committed, in order (want c)", v, ok)
	}
	mustState(t, s, k, fence.State{Token: tok, Position: 2, Claimant: "test"})
}

// A queued statement that fails fails Apply, naming the statement and wrapping the server's
// error, and nothing commits: neither the statements around it nor the fence's advance.
func TestApplyQueuedStatementFailureCommitsNothing(t *testing.T) {
	s, pool := newStore(t)
	ctx := testenv.Context(t, 30*time.Second)
	k, tok := claimed(t, s)
	err := s.Apply(ctx, k, tok, 0, 2, func(ctx context.Context, tx pgx.Tx) error {
		for _, kv := range [][2]string{{"a", "1"}, {"b", "fail"}, {"c", "3"}} {
			if _, err := tx.Exec(ctx, upsertKV, kv[0], kv[1]); err != nil {
				return err
			}
		}
		return nil
	})
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "23514" {
		t.Fatalf("Apply = %v: want the failing statement's check violation (23514) from the commit's flush", err)
	}
	if !strings.Contains(err.Error(), "statement 2 of the transaction (INSERT INTO kv") {
		t.Errorf("Apply = %v: want the failing statement named by position and SQL", err)
	}
	var perm interface{ Permanent() bool }
	if !errors.As(err, &perm) || !perm.Permanent() {
		t.Errorf("Apply = %v: a constraint violation of a queued statement is not permanent", err)
	}
	for _, key := range []string{"a", "b", "c"} {
		if v, ok := readKV(t, pool, key); ok {
			t.Errorf("kv %s = %q committed though statement 2 of its transaction failed", key, v)
		}
	}
	mustState(t, s, k, fence.State{Token: tok, Position: fence.NoPosition, Claimant: "test"})
}

// A handler that reads after a failed statement gets the failure; one that ignores it and
// goes on queueing statements commits none of them.
func TestApplyStatementsAfterAFailureNeverCommit(t *testing.T) {
	s, pool := newStore(t)
	ctx := testenv.Context(t, 30*time.Second)
	k, tok := claimed(t, s)
	var readErr error
	err := s.Apply(ctx, k, tok, 0, 2, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, upsertKV, "a", "fail"); err != nil {
			return err
		}
		var n int
		readErr = tx.QueryRow(ctx, `SELECT count(*) FROM kv`).Scan(&n)
		// ignored: the handler goes on
		if _, err := tx.Exec(ctx, upsertKV, "b", "2"); err != nil && !errors.Is(err, readErr) {
			t.Errorf("Exec after a failure = %v, want the failure (%v)", err, readErr)
		}
		return nil
	})
	var pe *pgconn.PgError
	if !errors.As(readErr, &pe) || pe.Code != "23514" {
		t.Errorf("QueryRow after a failing queued statement = %v, want its error", readErr)
	}
	if !errors.As(err, &pe) || pe.Code != "23514" {
		t.Fatalf("Apply = %v: want the failed statement's error, whatever the handler returned", err)
	}
	if v, ok := readKV(t, pool, "b"); ok {
		t.Errorf("kv b = %q committed: a statement queued after a failure was sent and committed", v)
	}
	mustState(t, s, k, fence.State{Token: tok, Position: fence.NoPosition, Claimant: "test"})
}

// A read after queued writes sees them: the read sends the queue first, in order.
func TestApplyReadSeesQueuedWrites(t *testing.T) {
	s, _ := newStore(t)
	ctx := testenv.Context(t, 30*time.Second)
	k, tok := claimed(t, s)
	err := s.Apply(ctx, k, tok, 0, 0, func(ctx context.Context, tx pgx.Tx) error {
		for _, v := range []string{"1", "2"} {
			if _, err := tx.Exec(ctx, upsertKV, "k", v); err != nil {
				return err
			}
		}
		var v string
		if err := tx.QueryRow(ctx, `SELECT v FROM kv WHERE k = $1`, "k").Scan(&v); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if v != "2" {
			t.Errorf("QueryRow after two queued writes read %q, want 2", v)
		}
		rows, err := tx.Query(ctx, `SELECT v FROM kv`)
		if err != nil {
			return err
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, upsertKV, "k", "3"); err != nil {
			return err
		}
		if len(got) != 1 || got[0] != "2" {
			t.Errorf("Query after queued writes read %v, want [2]", got)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
}

// A stale token's batch is refused before the handler runs: nothing it would queue commits.
func TestApplyZombieQueuesNothing(t *testing.T) {
	s, pool := newStore(t)
	ctx := testenv.Context(t, 30*time.Second)
	k, tok := claimed(t, s)
	if _, err := s.Claim(ctx, k, fence.Token{Epoch: 2}, "next"); err != nil {
		t.Fatal(err)
	}
	ran := false
	err := s.Apply(ctx, k, tok, 0, 0, func(ctx context.Context, tx pgx.Tx) error {
		ran = true
		_, err := tx.Exec(ctx, upsertKV, "z", "zombie")
		return err
	})
	var stale *fence.StaleError
	if !errors.As(err, &stale) {
		t.Fatalf("Apply under a stale token = %v, want a *fence.StaleError", err)
	}
	if ran {
		t.Error("the handler ran under a refused fence")
	}
	if v, ok := readKV(t, pool, "z"); ok {
		t.Errorf("kv z = %q: a zombie's queued write committed", v)
	}
}

// Admit reads its own statement's outcome in the handler's pipelining transaction, after
// queued statements.
func TestAdmitInApplysTransaction(t *testing.T) {
	s, _ := newStore(t)
	ctx := testenv.Context(t, 30*time.Second)
	k, tok := claimed(t, s)
	var got []fence.Verdict
	err := s.Apply(ctx, k, tok, 0, 0, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, upsertKV, "k", "v"); err != nil {
			return err
		}
		for range 2 {
			v, err := s.Admit(ctx, tx, "scope", "id", tok, 1)
			if err != nil {
				return err
			}
			got = append(got, v)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if len(got) != 2 || got[0] != fence.Admitted || got[1] != fence.Duplicate {
		t.Fatalf("Admit twice in Apply's transaction: %v, want [Admitted Duplicate]", got)
	}
}
