package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/internal/outboxstore"
)

// Store is what the suite needs of an outbox store: the relay's [outbox.Store] plus the
// appending, backlog and cleanup methods pgoutbox and sqliteoutbox share. Tx is the store's
// transaction type.
type Store[Tx any] interface {
	outbox.Store
	// Append adds msgs to src's outbox inside tx. It must write nothing and fail with a
	// *fence.StaleError if src's fence stores a higher token than tok, with
	// outbox.ErrUnfenced if it stores another token or none, and with outbox.ErrInvalid,
	// ErrTooLarge or ErrInvalid for bad input, before any statement.
	Append(ctx context.Context, tx Tx, src fence.Key, tok fence.Token, msgs ...outbox.Message) error
	// Backlog returns how many rows of src are appended and not yet delivered.
	Backlog(ctx context.Context, src fence.Key) (int64, error)
	// Cleanup deletes delivered rows appended more than olderThan ago.
	Cleanup(ctx context.Context, olderThan time.Duration) (int64, error)
	// DeadLetters returns up to limit dead-lettered rows of src in sequence order.
	DeadLetters(ctx context.Context, src fence.Key, limit int) ([]outbox.DeadRow, error)
}

// Env is one freshly created store under test, with the fence sink of the same database.
type Env[Tx any] struct {
	// Store is the outbox store under test.
	Store Store[Tx]
	// Fences is the fenced sink whose fence table the store checks (pgfence for pgoutbox,
	// sqlitefence for sqliteoutbox), over the same database.
	Fences fence.Sink[Tx]
	// Begin starts a transaction the caller holds and returns functions that commit or roll
	// it back. Rollback after commit must be harmless, and rollback must not depend on ctx:
	// the suite rolls back in t.Cleanup, after the case's context has ended.
	Begin func(ctx context.Context) (tx Tx, commit func() error, rollback func() error, err error)
	// MaxMessageBytes is the store's configured bound (0: outboxstore.DefaultMaxMessageBytes).
	MaxMessageBytes int
}

// timeout bounds every case: a store that blocks (a lock never released, a transaction left
// open) fails the case with a deadline error instead of hanging the test binary.
const timeout = 10 * time.Second

// Run runs the conformance suite. open is called once per case and must return a fresh, empty
// store (its own schema or file) that it cleans up when t ends. Cases run in parallel.
func Run[Tx any](t *testing.T, open func(t *testing.T) Env[Tx]) {
	t.Helper()
	cases := []struct {
		name string
		run  func(t *testing.T, e env[Tx])
	}{
		{"AppendNeedsExactToken", appendNeedsExactToken[Tx]},
		{"AppendStaleRefused", appendStaleRefused[Tx]},
		{"AppendUnfenced", appendUnfenced[Tx]},
		{"SequencesGapFreeConcurrent", sequencesGapFree[Tx]},
		{"RolledBackAppendLeavesNoGap", rolledBackLeavesNoGap[Tx]},
		{"RelayFenced", relayFenced[Tx]},
		{"BadInputRefusedBeforeAnyStatement", badInput[Tx]},
		{"CleanupNeverReusesSequences", cleanupNeverReuses[Tx]},
		{"DeadLetterFenced", deadLetterFenced[Tx]},
		{"DeadLetteredRowsSkippedNeverReused", deadLetteredSkipped[Tx]},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), timeout)
			defer cancel()
			c.run(t, env[Tx]{Env: open(t), ctx: ctx})
		})
	}
}

// env is an Env with the case's deadline.
type env[Tx any] struct {
	Env[Tx]
	ctx context.Context
}

func tok(era, epoch int64) fence.Token { return fence.Token{Era: era, Epoch: epoch} }

func key(topic string) fence.Key { return fence.Key{Group: "outboxtest", Topic: topic, Partition: 1} }

func msg(v string) outbox.Message {
	return outbox.Message{Topic: "dest", Key: []byte("k"), Value: []byte(v)}
}

func (e env[Tx]) claim(t *testing.T, k fence.Key, tk fence.Token) {
	t.Helper()
	if _, err := e.Fences.Claim(e.ctx, k, tk, "outboxtest"); err != nil {
		t.Fatalf("Claim(%s, %s): %v", k, tk, err)
	}
}

// begin starts a transaction that is rolled back when t ends if it is still open, with a
// context of its own: t.Context() is cancelled before cleanups run, and a rollback must not
// wait for ever.
func (e env[Tx]) begin(t *testing.T) (Tx, func() error) {
	t.Helper()
	tx, commit, rollback, err := e.Begin(e.ctx)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	t.Cleanup(func() { _ = rollback() })
	return tx, commit
}

// appendTx appends msgs in a transaction of its own and commits it if Append succeeds.
func (e env[Tx]) appendTx(ctx context.Context, src fence.Key, tk fence.Token, msgs ...outbox.Message) error {
	tx, commit, rollback, err := e.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = rollback() }()
	if err := e.Store.Append(ctx, tx, src, tk, msgs...); err != nil {
		return err
	}
	return commit()
}

func (e env[Tx]) mustAppend(t *testing.T, src fence.Key, tk fence.Token, msgs ...outbox.Message) {
	t.Helper()
	if err := e.appendTx(e.ctx, src, tk, msgs...); err != nil {
		t.Fatalf("Append(%s, %s, %d messages): %v", src, tk, len(msgs), err)
	}
}

// pending returns the sequences and values of src's undelivered rows.
func (e env[Tx]) pending(t *testing.T, src fence.Key, tk fence.Token) ([]int64, []string) {
	t.Helper()
	rows, err := e.Store.Pending(e.ctx, src, tk, 10_000)
	if err != nil {
		t.Fatalf("Pending(%s, %s): %v", src, tk, err)
	}
	var seqs []int64
	var vals []string
	for _, r := range rows {
		if r.Source != src {
			t.Fatalf("Pending(%s) returned a row of %s", src, r.Source)
		}
		seqs = append(seqs, r.Seq)
		vals = append(vals, string(r.Value))
	}
	return seqs, vals
}

func (e env[Tx]) backlog(t *testing.T, src fence.Key) int64 {
	t.Helper()
	n, err := e.Store.Backlog(e.ctx, src)
	if err != nil {
		t.Fatalf("Backlog(%s): %v", src, err)
	}
	return n
}

func seqRange(from, to int64) []int64 {
	var s []int64
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

func wantPending[Tx any](t *testing.T, e env[Tx], src fence.Key, tk fence.Token, seqs []int64, vals []string) {
	t.Helper()
	gs, gv := e.pending(t, src, tk)
	if !slices.Equal(gs, seqs) || !slices.Equal(gv, vals) {
		t.Fatalf("Pending(%s) = seqs %v values %q, want %v %q", src, gs, gv, seqs, vals)
	}
}

// wantStale checks that err is a *fence.StaleError for k carrying stored and presented.
func wantStale(t *testing.T, what string, err error, k fence.Key, stored, presented fence.Token) {
	t.Helper()
	var se *fence.StaleError
	if !errors.As(err, &se) || !errors.Is(err, fence.ErrStale) {
		t.Fatalf("%s: error = %v, want a *fence.StaleError", what, err)
	}
	if se.Key != k || se.Stored != stored || se.Presented != presented {
		t.Fatalf("%s: StaleError = {Key %s, Stored %s, Presented %s}, want {%s, %s, %s}",
			what, se.Key, se.Stored, se.Presented, k, stored, presented)
	}
}

func wantIs(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: error = %v, want %v", what, err, target)
	}
}

// The owner's exact token appends; a token the fence does not store (a higher one not yet
// claimed) is refused with ErrUnfenced, until the same transaction advances the fence to it.
func appendNeedsExactToken[Tx any](t *testing.T, e env[Tx]) {
	k := key("exact")
	e.claim(t, k, tok(0, 2))
	e.mustAppend(t, k, tok(0, 2), msg("a"), msg("b"))
	rows, err := e.Store.Pending(e.ctx, k, tok(0, 2), 10)
	if err != nil || len(rows) != 2 {
		t.Fatalf("Pending = %d rows, %v; want 2", len(rows), err)
	}
	for _, r := range rows {
		if r.Token != tok(0, 2) || r.Topic != "dest" || r.IdempotencyKey == "" {
			t.Fatalf("row %d = token %s topic %q idempotency key %q; want the appender's token, dest, a key",
				r.Seq, r.Token, r.Topic, r.IdempotencyKey)
		}
	}

	err = e.appendTx(e.ctx, k, tok(0, 3), msg("higher"))
	wantIs(t, "Append under a higher token the fence does not store", err, outbox.ErrUnfenced)
	if errors.Is(err, fence.ErrStale) {
		t.Fatalf("Append under a higher token: %v is stale; the caller is not behind", err)
	}
	wantPending(t, e, k, tok(0, 2), []int64{1, 2}, []string{"a", "b"})

	// Claim the higher token, then advance and append in one transaction: the fence now
	// stores it.
	if _, err := e.Fences.Claim(e.ctx, k, tok(0, 3), "outboxtest"); err != nil {
		t.Fatalf("Claim: %v", err)
	}
	tx, commit := e.begin(t)
	if err := e.Fences.Advance(e.ctx, tx, k, tok(0, 3), 0, 0); err != nil {
		t.Fatalf("Advance: %v", err)
	}
	if err := e.Store.Append(e.ctx, tx, k, tok(0, 3), msg("c")); err != nil {
		t.Fatalf("Append after Advance in the same transaction: %v", err)
	}
	if err := commit(); err != nil {
		t.Fatalf("commit: %v", err)
	}
	wantPending(t, e, k, tok(0, 3), []int64{1, 2, 3}, []string{"a", "b", "c"})
}

// A deposed owner's append writes nothing and fails with a *fence.StaleError.
func appendStaleRefused[Tx any](t *testing.T, e env[Tx]) {
	k := key("stale")
	e.claim(t, k, tok(0, 1))
	e.mustAppend(t, k, tok(0, 1), msg("old"))
	e.claim(t, k, tok(0, 2)) // takeover

	err := e.appendTx(e.ctx, k, tok(0, 1), msg("zombie"))
	wantStale(t, "Append under a deposed token", err, k, tok(0, 2), tok(0, 1))

	// An old era is stale however high its epoch.
	if _, err := e.Fences.Recover(e.ctx, k, tok(0, 2), 1, "outboxtest", "outboxtest"); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	err = e.appendTx(e.ctx, k, tok(0, 99), msg("old era"))
	wantStale(t, "Append under an old era", err, k, tok(1, 1), tok(0, 99))

	wantPending(t, e, k, tok(1, 1), []int64{1}, []string{"old"})
	if n := e.backlog(t, k); n != 1 {
		t.Fatalf("Backlog = %d after refused appends, want 1", n)
	}
}

// A source partition whose fence was never claimed has no owner: appends fail with
// ErrUnfenced and write nothing, whatever the token.
func appendUnfenced[Tx any](t *testing.T, e env[Tx]) {
	k := key("unfenced")
	for _, tk := range []fence.Token{{}, tok(0, 1)} {
		err := e.appendTx(e.ctx, k, tk, msg("x"))
		wantIs(t, "Append without a fence row", err, outbox.ErrUnfenced)
	}
	if n := e.backlog(t, k); n != 0 {
		t.Fatalf("Backlog = %d after refused appends, want 0", n)
	}
	// Claiming another key of the same topic does not fence this one.
	other := k
	other.Partition = 2
	e.claim(t, other, tok(0, 1))
	wantIs(t, "Append to a key whose neighbour is claimed", e.appendTx(e.ctx, k, tok(0, 1), msg("x")), outbox.ErrUnfenced)
	e.claim(t, k, tok(0, 1))
	wantPending(t, e, k, tok(0, 1), nil, nil)
}

// Concurrent appenders of one source partition get gap-free sequences: the committed rows are
// numbered 1..n with no hole and no repeat, each transaction's rows are consecutive and in
// its order, and rolled-back transactions leave nothing.
func sequencesGapFree[Tx any](t *testing.T, e env[Tx]) {
	k := key("concurrent")
	e.claim(t, k, tok(0, 1))
	const writers, txs = 6, 5
	var (
		mu        sync.Mutex
		committed = map[string][]string{} // tx name -> its values
		wg        sync.WaitGroup
		errs      = make(chan error, writers*txs)
	)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range txs {
				name := fmt.Sprintf("w%d.%d", w, i)
				var vals []string
				for j := range 1 + (w+i)%3 {
					vals = append(vals, name+"/"+strconv.Itoa(j))
				}
				msgs := make([]outbox.Message, len(vals))
				for j, v := range vals {
					msgs[j] = msg(v)
				}
				rollback := (w+i)%4 == 3
				err := func() error {
					tx, commit, rb, err := e.Begin(e.ctx)
					if err != nil {
						return fmt.Errorf("begin: %w", err)
					}
					defer func() { _ = rb() }()
					if err := e.Store.Append(e.ctx, tx, k, tok(0, 1), msgs...); err != nil {
						return fmt.Errorf("%s: append: %w", name, err)
					}
					if rollback {
						return rb()
					}
					return commit()
				}()
				if err != nil {
					errs <- err
					return
				}
				if !rollback {
					mu.Lock()
					committed[name] = vals
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	total := 0
	for _, v := range committed {
		total += len(v)
	}
	seqs, vals := e.pending(t, k, tok(0, 1))
	if want := seqRange(1, int64(total)); !slices.Equal(seqs, want) {
		t.Fatalf("sequences of %d committed rows = %v, want %v", total, seqs, want)
	}
	// Each committed transaction's rows appear consecutively, in order; nothing else appears.
	for i := 0; i < len(vals); {
		name, _, _ := strings.Cut(vals[i], "/")
		want, ok := committed[name]
		if !ok {
			t.Fatalf("row %d (%q) belongs to no committed transaction", seqs[i], vals[i])
		}
		if i+len(want) > len(vals) || !slices.Equal(vals[i:i+len(want)], want) {
			t.Fatalf("rows from seq %d = %q, want the transaction's rows %q consecutively", seqs[i], vals[i:min(len(vals), i+len(want))], want)
		}
		delete(committed, name)
		i += len(want)
	}
	if n := e.backlog(t, k); n != int64(total) {
		t.Fatalf("Backlog = %d, want %d", n, total)
	}
}

// An appender that rolls back while another waits for the sequence: the waiting one gets the
// numbers the rolled-back one had, so sequences stay gap-free in commit order.
func rolledBackLeavesNoGap[Tx any](t *testing.T, e env[Tx]) {
	k := key("rollback")
	e.claim(t, k, tok(0, 1))
	e.mustAppend(t, k, tok(0, 1), msg("first"))

	tx, commit, rollback, err := e.Begin(e.ctx)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	t.Cleanup(func() { _ = rollback() })
	if err := e.Store.Append(e.ctx, tx, k, tok(0, 1), msg("rolled back 1"), msg("rolled back 2")); err != nil {
		t.Fatalf("Append: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- e.appendTx(e.ctx, k, tok(0, 1), msg("second"), msg("third")) }()
	time.Sleep(50 * time.Millisecond) // lets the second appender reach the store's lock
	if err := rollback(); err != nil {
		t.Fatalf("rollback: %v", err)
	}
	_ = commit // the first appender never commits
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Append after the other appender rolled back: %v", err)
		}
	case <-e.ctx.Done():
		t.Fatalf("the second appender is still waiting: %v", e.ctx.Err())
	}
	wantPending(t, e, k, tok(0, 1), []int64{1, 2, 3}, []string{"first", "second", "third"})
}

// The relay's reads and marks are fenced: a deposed owner's Pending and MarkDelivered fail
// with a *fence.StaleError and mark nothing; an unclaimed source or a token the fence does not
// store fails with ErrUnfenced; the owner marks, and cannot mark a sequence never allocated.
func relayFenced[Tx any](t *testing.T, e env[Tx]) {
	k := key("relay")
	e.claim(t, k, tok(0, 1))
	e.mustAppend(t, k, tok(0, 1), msg("a"), msg("b"), msg("c"))

	backlog, err := e.Store.MarkDelivered(e.ctx, k, tok(0, 1), 1)
	if err != nil || backlog != 2 {
		t.Fatalf("MarkDelivered(1) = %d, %v; want backlog 2", backlog, err)
	}
	wantPending(t, e, k, tok(0, 1), []int64{2, 3}, []string{"b", "c"})
	_, err = e.Store.MarkDelivered(e.ctx, k, tok(0, 1), 4)
	wantIs(t, "MarkDelivered beyond the last sequence", err, outbox.ErrInvalid)

	_, err = e.Store.Pending(e.ctx, k, tok(0, 2), 10)
	wantIs(t, "Pending under a token the fence does not store", err, outbox.ErrUnfenced)
	_, err = e.Store.MarkDelivered(e.ctx, k, tok(0, 2), 2)
	wantIs(t, "MarkDelivered under a token the fence does not store", err, outbox.ErrUnfenced)

	e.claim(t, k, tok(0, 2)) // takeover
	_, err = e.Store.Pending(e.ctx, k, tok(0, 1), 10)
	wantStale(t, "Pending of a deposed relay", err, k, tok(0, 2), tok(0, 1))
	_, err = e.Store.MarkDelivered(e.ctx, k, tok(0, 1), 3)
	wantStale(t, "MarkDelivered of a deposed relay", err, k, tok(0, 2), tok(0, 1))
	if n := e.backlog(t, k); n != 2 {
		t.Fatalf("Backlog = %d after a refused mark, want 2", n)
	}
	// The new owner's relay publishes the deposed owner's rows: they were committed.
	wantPending(t, e, k, tok(0, 2), []int64{2, 3}, []string{"b", "c"})
	if backlog, err := e.Store.MarkDelivered(e.ctx, k, tok(0, 2), 3); err != nil || backlog != 0 {
		t.Fatalf("MarkDelivered(3) by the new owner = %d, %v; want 0", backlog, err)
	}

	u := key("relay-unfenced")
	_, err = e.Store.Pending(e.ctx, u, tok(0, 1), 10)
	wantIs(t, "Pending of an unclaimed source", err, outbox.ErrUnfenced)
	_, err = e.Store.MarkDelivered(e.ctx, u, tok(0, 1), 1)
	wantIs(t, "MarkDelivered of an unclaimed source", err, outbox.ErrUnfenced)
}

// Bad input is refused with its sentinel before any statement: on a transaction that has
// already ended (so any statement would fail with another error) and on a live one, whose
// commit then writes nothing.
func badInput[Tx any](t *testing.T, e env[Tx]) {
	k := key("bad")
	e.claim(t, k, tok(0, 1))
	limit := e.MaxMessageBytes
	if limit == 0 {
		limit = outboxstore.DefaultMaxMessageBytes
	}
	ok := msg("ok")
	cases := []struct {
		name string
		src  fence.Key
		tk   fence.Token
		m    outbox.Message
		want error
	}{
		{"no topic", k, tok(0, 1), outbox.Message{Value: []byte("v")}, outbox.ErrInvalid},
		{"too large", k, tok(0, 1), outbox.Message{Topic: "dest", Value: make([]byte, limit+1)}, outbox.ErrTooLarge},
		{"too large with headers", k, tok(0, 1), outbox.Message{Topic: "dest", Value: make([]byte, limit),
			Headers: []kgo.RecordHeader{{Key: "h", Value: []byte("v")}}}, outbox.ErrTooLarge},
		{"reserved header", k, tok(0, 1), outbox.Message{Topic: "dest", Headers: []kgo.RecordHeader{{Key: "baton-token"}}}, outbox.ErrInvalid},
		{"traceparent header", k, tok(0, 1), outbox.Message{Topic: "dest", Headers: []kgo.RecordHeader{{Key: "TraceParent"}}}, outbox.ErrInvalid},
		{"empty header key", k, tok(0, 1), outbox.Message{Topic: "dest", Headers: []kgo.RecordHeader{{Value: []byte("v")}}}, outbox.ErrInvalid},
		{"illegal topic", k, tok(0, 1), outbox.Message{Topic: "a topic"}, outbox.ErrInvalid},
		{"bad idempotency key", k, tok(0, 1), outbox.Message{Topic: "dest", IdempotencyKey: "\xff"}, outbox.ErrInvalid},
		{"bad source", fence.Key{Topic: "t"}, tok(0, 1), ok, outbox.ErrInvalid},
		{"negative token", k, tok(0, -1), ok, outbox.ErrInvalid},
	}
	for _, c := range cases {
		// Ended transaction: only a check made before any statement can return the sentinel.
		tx, commit, _, err := e.Begin(e.ctx)
		if err != nil {
			t.Fatalf("begin: %v", err)
		}
		if err := commit(); err != nil {
			t.Fatalf("commit: %v", err)
		}
		err = e.Store.Append(e.ctx, tx, c.src, c.tk, ok, c.m)
		wantIs(t, c.name+" (on an ended transaction, so before any statement)", err, c.want)

		// Live transaction, committed after the refusal: nothing may have been written.
		tx, commit = e.begin(t)
		err = e.Store.Append(e.ctx, tx, c.src, c.tk, ok, c.m)
		wantIs(t, c.name, err, c.want)
		if err := commit(); err != nil {
			t.Fatalf("%s: commit after the refusal: %v", c.name, err)
		}
		if n := e.backlog(t, k); n != 0 {
			t.Fatalf("%s: Backlog = %d after a refused append, want 0", c.name, n)
		}
	}
	wantPending(t, e, k, tok(0, 1), nil, nil)
	e.mustAppend(t, k, tok(0, 1), ok)
	wantPending(t, e, k, tok(0, 1), []int64{1}, []string{"ok"})
}

// Cleanup deletes delivered rows only, and the sequences and idempotency keys of deleted rows
// are never handed out again, by the same owner or the next.
func cleanupNeverReuses[Tx any](t *testing.T, e env[Tx]) {
	k := key("cleanup")
	e.claim(t, k, tok(0, 1))
	e.mustAppend(t, k, tok(0, 1), msg("a"), msg("b"), msg("c"))
	keys := map[string]int64{}
	remember := func(tk fence.Token) {
		rows, err := e.Store.Pending(e.ctx, k, tk, 100)
		if err != nil {
			t.Fatalf("Pending: %v", err)
		}
		for _, r := range rows {
			if s, dup := keys[r.IdempotencyKey]; dup && s != r.Seq {
				t.Fatalf("idempotency key %q of seq %d was already used by seq %d", r.IdempotencyKey, r.Seq, s)
			}
			keys[r.IdempotencyKey] = r.Seq
		}
	}
	remember(tok(0, 1))
	if _, err := e.Store.MarkDelivered(e.ctx, k, tok(0, 1), 2); err != nil {
		t.Fatalf("MarkDelivered: %v", err)
	}
	if n, err := e.Store.Cleanup(e.ctx, 0); err != nil || n != 2 {
		t.Fatalf("Cleanup(0) = %d, %v; want the 2 delivered rows deleted", n, err)
	}
	wantPending(t, e, k, tok(0, 1), []int64{3}, []string{"c"}) // undelivered rows stay

	if _, err := e.Store.MarkDelivered(e.ctx, k, tok(0, 1), 3); err != nil {
		t.Fatalf("MarkDelivered: %v", err)
	}
	if n, err := e.Store.Cleanup(e.ctx, 0); err != nil || n != 1 {
		t.Fatalf("Cleanup(0) = %d, %v; want 1", n, err)
	}
	// Every row is gone; the next append continues the sequence.
	e.mustAppend(t, k, tok(0, 1), msg("d"))
	wantPending(t, e, k, tok(0, 1), []int64{4}, []string{"d"})
	remember(tok(0, 1))
	if _, err := e.Store.MarkDelivered(e.ctx, k, tok(0, 1), 4); err != nil {
		t.Fatalf("MarkDelivered: %v", err)
	}
	if n, err := e.Store.Cleanup(e.ctx, 0); err != nil || n != 1 {
		t.Fatalf("Cleanup(0) = %d, %v; want 1", n, err)
	}
	// The next owner continues it too.
	e.claim(t, k, tok(0, 2))
	e.mustAppend(t, k, tok(0, 2), msg("e"), msg("f"))
	wantPending(t, e, k, tok(0, 2), []int64{5, 6}, []string{"e", "f"})
	remember(tok(0, 2))
	// A retention longer than the rows' age deletes nothing.
	if _, err := e.Store.MarkDelivered(e.ctx, k, tok(0, 2), 6); err != nil {
		t.Fatalf("MarkDelivered: %v", err)
	}
	if n, err := e.Store.Cleanup(e.ctx, time.Hour); err != nil || n != 0 {
		t.Fatalf("Cleanup(1h) = %d, %v; want 0", n, err)
	}
	_, err := e.Store.Cleanup(e.ctx, -time.Second)
	wantIs(t, "Cleanup with a negative retention", err, outbox.ErrInvalid)
}

func (e env[Tx]) deadLetters(t *testing.T, src fence.Key) []outbox.DeadRow {
	t.Helper()
	d, err := e.Store.DeadLetters(e.ctx, src, 100)
	if err != nil {
		t.Fatalf("DeadLetters(%s): %v", src, err)
	}
	return d
}

// Dead-lettering is a fenced mark of exactly the first pending row: a deposed owner's fails
// with a *fence.StaleError, an unclaimed source or a token the fence does not store with
// ErrUnfenced, a row that is not the first pending one (or is already past) or a bad reason
// with ErrInvalid; none of them changes anything. The owner's keeps the row with its reason
// and token and moves past it.
func deadLetterFenced[Tx any](t *testing.T, e env[Tx]) {
	k := key("dead")
	e.claim(t, k, tok(0, 1))
	e.mustAppend(t, k, tok(0, 1), msg("a"), msg("b"), msg("c"))

	_, err := e.Store.DeadLetter(e.ctx, k, tok(0, 1), 2, "reason")
	wantIs(t, "DeadLetter of a row that is not the first pending one", err, outbox.ErrInvalid)
	_, err = e.Store.DeadLetter(e.ctx, k, tok(0, 1), 4, "reason")
	wantIs(t, "DeadLetter of a sequence never allocated", err, outbox.ErrInvalid)
	for _, bad := range []string{"", "nul\x00", "\xff", strings.Repeat("r", outboxstore.MaxReasonLen+1)} {
		_, err = e.Store.DeadLetter(e.ctx, k, tok(0, 1), 1, bad)
		wantIs(t, fmt.Sprintf("DeadLetter with reason %q", bad), err, outbox.ErrInvalid)
	}
	_, err = e.Store.DeadLetter(e.ctx, k, tok(0, 2), 1, "reason")
	wantIs(t, "DeadLetter under a token the fence does not store", err, outbox.ErrUnfenced)
	_, err = e.Store.DeadLetter(e.ctx, key("dead-unfenced"), tok(0, 1), 1, "reason")
	wantIs(t, "DeadLetter of an unclaimed source", err, outbox.ErrUnfenced)

	e.claim(t, k, tok(0, 2)) // takeover
	_, err = e.Store.DeadLetter(e.ctx, k, tok(0, 1), 1, "zombie")
	wantStale(t, "DeadLetter of a deposed relay", err, k, tok(0, 2), tok(0, 1))
	wantPending(t, e, k, tok(0, 2), []int64{1, 2, 3}, []string{"a", "b", "c"})
	if n := e.backlog(t, k); n != 3 {
		t.Fatalf("Backlog = %d after refused dead letters, want 3", n)
	}
	if d := e.deadLetters(t, k); len(d) != 0 {
		t.Fatalf("DeadLetters = %d rows after refused dead letters, want none", len(d))
	}

	backlog, err := e.Store.DeadLetter(e.ctx, k, tok(0, 2), 1, "message_too_large: 2 MB")
	if err != nil || backlog != 2 {
		t.Fatalf("DeadLetter(1) by the owner = %d, %v; want backlog 2", backlog, err)
	}
	wantPending(t, e, k, tok(0, 2), []int64{2, 3}, []string{"b", "c"})
	_, err = e.Store.DeadLetter(e.ctx, k, tok(0, 2), 1, "again")
	wantIs(t, "DeadLetter of a row already dead-lettered", err, outbox.ErrInvalid)
	d := e.deadLetters(t, k)
	if len(d) != 1 {
		t.Fatalf("DeadLetters = %d rows, want 1", len(d))
	}
	if g := d[0]; g.Seq != 1 || string(g.Value) != "a" || g.Topic != "dest" || g.Token != tok(0, 1) ||
		g.By != tok(0, 2) || g.Reason != "message_too_large: 2 MB" || g.IdempotencyKey == "" || g.Source != k {
		t.Fatalf("dead letter = seq %d value %q topic %q token %s by %s reason %q key %q source %s; want seq 1, a, dest, 0.1, by 0.2, the reason",
			g.Seq, g.Value, g.Topic, g.Token, g.By, g.Reason, g.IdempotencyKey, g.Source)
	}
}

// Dead-lettered rows are never pending again and their sequences are never handed out again:
// appends continue after them, through Cleanup and a takeover, and Cleanup keeps the dead
// letters.
func deadLetteredSkipped[Tx any](t *testing.T, e env[Tx]) {
	k := key("dead-skip")
	e.claim(t, k, tok(0, 1))
	e.mustAppend(t, k, tok(0, 1), msg("a"), msg("b"))
	if _, err := e.Store.MarkDelivered(e.ctx, k, tok(0, 1), 1); err != nil {
		t.Fatalf("MarkDelivered: %v", err)
	}
	backlog, err := e.Store.DeadLetter(e.ctx, k, tok(0, 1), 2, "unknown_topic")
	if err != nil || backlog != 0 {
		t.Fatalf("DeadLetter(2) = %d, %v; want backlog 0", backlog, err)
	}
	wantPending(t, e, k, tok(0, 1), nil, nil)
	e.mustAppend(t, k, tok(0, 1), msg("c"))
	wantPending(t, e, k, tok(0, 1), []int64{3}, []string{"c"})
	if _, err := e.Store.Cleanup(e.ctx, 0); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	wantPending(t, e, k, tok(0, 1), []int64{3}, []string{"c"})
	e.claim(t, k, tok(0, 2))
	e.mustAppend(t, k, tok(0, 2), msg("d"))
	wantPending(t, e, k, tok(0, 2), []int64{3, 4}, []string{"c", "d"})
	if d := e.deadLetters(t, k); len(d) != 1 || d[0].Seq != 2 || string(d[0].Value) != "b" {
		t.Fatalf("DeadLetters after Cleanup and a takeover = %+v, want seq 2 (b) kept", d)
	}
	if n := e.backlog(t, k); n != 2 {
		t.Fatalf("Backlog = %d, want 2", n)
	}
}
