package pgfence

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/batonhq/baton/internal/testkit/testenv"
)

// A handler that guards a statement with a savepoint it sets in SQL, and recovers from the
// statement's error by rolling back to it, goes on and commits what follows, as in any pgx
// transaction: the guarded statement's error must reach the handler from its Exec, in time
// to roll back to the savepoint.
func TestApplySavepointInSQLRecoversAStatementsError(t *testing.T) {
	s, pool := newStore(t)
	ctx := testenv.Context(t, 30*time.Second)
	k, tok := claimed(t, s)
	var guarded error
	err := s.Apply(ctx, k, tok, 0, 0, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SAVEPOINT guard"); err != nil {
			return err
		}
		_, guarded = tx.Exec(ctx, upsertKV, "a", "fail")
		if guarded != nil {
			if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT guard"); err != nil {
				return err
			}
		} else if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT guard"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, upsertKV, "b", "after")
		return err
	})
	var pe *pgconn.PgError
	if !errors.As(guarded, &pe) || pe.Code != "23514" {
		t.Errorf("Exec of the statement guarded by the savepoint = %v, want its check violation (23514)", guarded)
	}
	if err != nil {
		t.Fatalf("Apply = %v: a handler that rolled back to its savepoint over the failed statement fails (permanent: %v)", err, permanent(err))
	}
	if v, ok := readKV(t, pool, "b"); v != "after" {
		t.Errorf("kv b = %q (present %v), want after: the write after the recovered savepoint did not commit", v, ok)
	}
}

// A statement the handler issues on its transaction while a savepoint it began is open runs
// inside that savepoint, and rolls back with it.
func TestApplyStatementInsideARolledBackSavepointRollsBack(t *testing.T) {
	s, pool := newStore(t)
	ctx := testenv.Context(t, 30*time.Second)
	k, tok := claimed(t, s)
	err := s.Apply(ctx, k, tok, 0, 0, func(ctx context.Context, tx pgx.Tx) error {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, upsertKV, "inside", "undone"); err != nil {
			return err
		}
		return sp.Rollback(ctx)
	})
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if v, ok := readKV(t, pool, "inside"); ok {
		t.Errorf("kv inside = %q: a write issued inside a savepoint the handler rolled back committed", v)
	}
}

// Statements reach the database in the order the handler issued them, whichever handle of
// the transaction it issued them on: the transaction itself, a savepoint it began, or its
// connection.
func TestApplyStatementsRunInIssueOrderAcrossHandles(t *testing.T) {
	for _, via := range []string{"savepoint", "conn"} {
		t.Run(via, func(t *testing.T) {
			s, pool := newStore(t)
			ctx := testenv.Context(t, 30*time.Second)
			k, tok := claimed(t, s)
			err := s.Apply(ctx, k, tok, 0, 0, func(ctx context.Context, tx pgx.Tx) error {
				var exec func(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
				var done func(ctx context.Context) error
				switch via {
				case "savepoint":
					sp, err := tx.Begin(ctx)
					if err != nil {
						return err
					}
					exec, done = sp.Exec, sp.Commit
				case "conn":
					c := tx.Conn()
					exec, done = c.Exec, func(context.Context) error { return nil }
				}
				if _, err := tx.Exec(ctx, upsertKV, "k", "first"); err != nil {
					return err
				}
				if _, err := exec(ctx, upsertKV, "k", "second"); err != nil {
					return err
				}
				return done(ctx)
			})
			if err != nil {
				t.Fatalf("Apply: %v", err)
			}
			if v, _ := readKV(t, pool, "k"); v != "second" {
				t.Errorf("kv k = %q, want second: the first write (on the transaction) ran after the second (on the %s)", v, via)
			}
		})
	}
}

// Whether the consumer dead-letters a record over a constraint violation does not depend on
// how the handler sent the statement: queued by Exec with arguments, run at once by Exec
// without arguments or by QueryRow (what the upgrade notes tell handlers to use to read what
// a statement did), or checked at the commit (a deferred constraint).
func TestApplyConstraintViolationPermanenceIndependentOfHowItWasSent(t *testing.T) {
	s, pool := newStore(t)
	ctx := testenv.Context(t, 30*time.Second)
	k, tok := claimed(t, s)
	// A constraint checked at the commit that refuses the data itself: a deferred constraint
	// trigger raising a check violation (a deferred unique constraint's 23505 is one a
	// concurrent writer can cause, retried however it was sent).
	if _, err := pool.Exec(ctx, `CREATE TABLE dk (k text);
		CREATE FUNCTION dk_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF (SELECT count(*) FROM dk WHERE k = NEW.k) > 1 THEN
				RAISE EXCEPTION 'dk: % twice', NEW.k USING ERRCODE = 'check_violation';
			END IF;
			RETURN NULL;
		END $$;
		CREATE CONSTRAINT TRIGGER dk_k AFTER INSERT ON dk DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW EXECUTE FUNCTION dk_refuse()`); err != nil {
		t.Fatal(err)
	}
	ways := []struct {
		name string
		code string
		fn   func(ctx context.Context, tx pgx.Tx) error
	}{
		{"Exec with arguments", "23514", func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, upsertKV, "a", "fail")
			return err
		}},
		{"Exec without arguments", "23514", func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO kv (k, v) VALUES ('a', 'fail')`)
			return err
		}},
		{"QueryRow", "23514", func(ctx context.Context, tx pgx.Tx) error {
			var n int
			return tx.QueryRow(ctx, `WITH w AS (`+upsertKV+` RETURNING 1) SELECT count(*) FROM w`, "a", "fail").Scan(&n)
		}},
		{"deferred, at the commit", "23514", func(ctx context.Context, tx pgx.Tx) error {
			for range 2 {
				if _, err := tx.Exec(ctx, `INSERT INTO dk VALUES ($1)`, "x"); err != nil {
					return err
				}
			}
			return nil
		}},
	}
	got := map[string]bool{}
	for _, w := range ways {
		err := s.Apply(ctx, k, tok, 0, 0, w.fn)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != w.code {
			t.Fatalf("%s: Apply = %v, want SQLSTATE %s", w.name, err, w.code)
		}
		got[w.name] = permanent(err)
	}
	for _, w := range ways[1:] {
		if got[w.name] != got[ways[0].name] {
			t.Errorf("a constraint violation sent by %s: permanent %v; sent by %s: permanent %v", w.name, got[w.name], ways[0].name, got[ways[0].name])
		}
	}
}

// permanent is consumer.IsPermanent's reading of an error that the handler did not mark.
func permanent(err error) bool {
	var p interface{ Permanent() bool }
	return errors.As(err, &p) && p.Permanent()
}

// An Exec without arguments runs after the statements queued before it: it sees their writes,
// and what it writes is not overwritten by them at the commit.
func TestApplyExecWithoutArgumentsRunsAfterTheQueuedOnes(t *testing.T) {
	s, pool := newStore(t)
	ctx := testenv.Context(t, 30*time.Second)
	k, tok := claimed(t, s)
	err := s.Apply(ctx, k, tok, 0, 0, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, upsertKV, "k", "queued"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE kv SET v = v || ', then at once' WHERE k = 'k'`)
		return err
	})
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if v, _ := readKV(t, pool, "k"); v != "queued, then at once" {
		t.Errorf("kv k = %q, want %q: the Exec without arguments ran before the statement queued ahead of it", v, "queued, then at once")
	}
}
