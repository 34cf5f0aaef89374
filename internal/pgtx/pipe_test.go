package pgtx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/batonhq/baton/fence"
)

// A queued statement's error names its position and its SQL on one line, cut short; the
// server's error stays reachable; it is permanent only when the server refused the
// statement's data (class 22 or 23, but 23503, 23505 and 23P01, which a concurrent writer
// can cause).
func TestStatementError(t *testing.T) {
	sql := "INSERT INTO twins VALUES ($1, $2, 1)\n\t\tON CONFLICT (device) DO UPDATE SET reading = excluded.reading, updates = updates + 1"
	for code, permanent := range map[string]bool{
		"23505": false, "23P01": false, "23502": true, "23514": true, "22P02": true, "23503": false, "40001": false, "40P01": false, "57014": false, "": false,
	} {
		err := error(&statementError{what: "pgfence", pos: 3, sql: sql, err: &pgconn.PgError{Code: code, Message: "refused"}})
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != code {
			t.Errorf("%s: errors.As does not find the server's error in %v", code, err)
		}
		var p interface{ Permanent() bool }
		if !errors.As(err, &p) || p.Permanent() != permanent {
			t.Errorf("%s: permanent %v, want %v", code, p != nil && p.Permanent(), permanent)
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "pgfence: statement 3 of the transaction (INSERT INTO twins VALUES ($1, $2, 1) ON CONFLICT (device)...): ") {
			t.Errorf("%s: message %q does not name the statement on one line, cut short", code, msg)
		}
	}
	if p := (&statementError{err: errors.New("connection reset")}); p.Permanent() {
		t.Error("an error that is not the server's is permanent")
	}
}

// countTx is a transaction that counts the statements of the batches sent on it.
type countTx struct {
	pgx.Tx
	sent int
}

func (t *countTx) SendBatch(_ context.Context, b *pgx.Batch) pgx.BatchResults {
	t.sent += len(b.QueuedQueries)
	return errResults{}
}

// Several goroutines calling Exec on one Pipe lose no statement: each one queued is sent.
func TestPipeConcurrentExecLosesNoStatement(t *testing.T) {
	tx := &countTx{}
	p := NewPipe(context.Background(), tx, "pgfence", nil, false)
	const goroutines, each = 16, 50
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				if _, err := p.Exec(context.Background(), `INSERT INTO kv VALUES ($1, $2)`, g, i); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := p.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if tx.sent != goroutines*each {
		t.Errorf("the flush sent %d statements, want the %d queued by %d goroutines", tx.sent, goroutines*each, goroutines)
	}
}

// Classify marks permanent what the server refused for its data, and never the fence's own
// errors, its verdicts, or errors that are not the server's.
func TestClassify(t *testing.T) {
	check := &pgconn.PgError{Code: "23514", Message: "check"}
	perm := func(err error) bool {
		var p interface{ Permanent() bool }
		return errors.As(err, &p) && p.Permanent()
	}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"a statement's check violation", fmt.Errorf("apply: %w", check), true},
		{"a data exception", &pgconn.PgError{Code: "22P02"}, true},
		{"a concurrent writer's unique violation", &pgconn.PgError{Code: "23505"}, false},
		{"a foreign key", &pgconn.PgError{Code: "23503"}, false},
		{"an exclusion", &pgconn.PgError{Code: "23P01"}, false},
		{"the fence's own", Fence(fmt.Errorf("pgfence: advance: %w", check)), false},
		{"the fence's refusal", fmt.Errorf("%w: %w", fence.ErrInvalid, check), false},
		{"not the server's", errors.New("connection reset"), false},
	} {
		if got := perm(Classify(c.err)); got != c.want {
			t.Errorf("%s: permanent %v, want %v", c.name, got, c.want)
		}
	}
	if Classify(nil) != nil {
		t.Error("Classify(nil) is not nil")
	}
}
