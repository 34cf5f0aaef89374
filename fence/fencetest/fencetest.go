package fencetest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/fencecheck"
)

// Env is one freshly created store under test, with the hooks the suite needs to make the
// caller's own writes inside the store's transactions.
type Env[Tx any] struct {
	// Sink is the store under test.
	Sink fence.Sink[Tx]
	// Keyed is the store's keyed (per-entity) fence; nil skips the keyed cases.
	Keyed fence.KeyedSink[Tx]
	// Write is the caller's own write inside tx: it sets key to value in a user table. It
	// must fail (and only then) when value is "fail", so the suite can make a user write fail.
	Write func(ctx context.Context, tx Tx, key, value string) error
	// Read reads a user value committed by Write, outside any transaction.
	Read func(ctx context.Context, key string) (value string, ok bool, err error)
	// Reopen closes the store and opens it again over the same storage, returning the new
	// Env. Nil for stores that are not durable; the durability cases are then skipped.
	Reopen func(t testing.TB) Env[Tx]
	// Table constructs the store with the given table (or prefix) name and returns the
	// constructor's error. Nil for stores without table names.
	Table func(name string) error
	// Begin starts a transaction the caller holds, the way a user of [fence.Sink.Advance]
	// does, and returns functions that commit or roll it back. Nil skips the Advance cases;
	// the keyed cases then run their transactions through Apply on scratch fence keys.
	// Rollback after commit must be harmless, and rollback must not depend on ctx: the suite
	// rolls back every transaction still open in t.Cleanup, after the case's context ended.
	Begin func(ctx context.Context) (tx Tx, commit func() error, rollback func() error, err error)
}

// Run runs the conformance suite. open is called once per case and must return a fresh, empty
// store (its own schema, file or memory) that it cleans up when t ends.
func Run[Tx any](t *testing.T, open func(t *testing.T) Env[Tx]) {
	t.Helper()
	s := suite[Tx]{open: open, scratch: new(atomic.Int64)}
	cases := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"MonotonicClaims", s.monotonicClaims},
		{"EqualTokenManyBatches", s.equalTokenManyBatches},
		{"LowerTokenRefused", s.lowerTokenRefused},
		{"LaterEraNotInvented", s.laterEraNotInvented},
		{"ResumePosition", s.resumePosition},
		{"Duplicates", s.duplicates},
		{"EqualTokenOneClaimant", s.equalTokenOneClaimant},
		{"ClaimRaceOneClaimant", s.claimRaceOneClaimant},
		{"WriteNeedsClaimedToken", s.writeNeedsClaimedToken},
		{"OverlapRefused", s.overlapRefused},
		{"RaceHighestTokenWins", s.raceHighestTokenWins},
		{"AtomicUserWriteFails", s.atomicUserWriteFails},
		{"AtomicFnError", s.atomicFnError},
		{"AtomicStaleWriteInvisible", s.atomicStaleWriteInvisible},
		{"AdvanceInCallerTx", s.advanceInCallerTx},
		{"AdvanceHoldsKeyUntilTxEnds", s.advanceHoldsKey},
		{"Durability", s.durability},
		{"RegressionAndRecover", s.regressionAndRecover},
		{"RecoverConcurrent", s.recoverConcurrent},
		{"KeyedVerdicts", s.keyedVerdicts},
		{"KeyedScopeIsolation", s.keyedIsolation},
		{"KeyedAtomicity", s.keyedAtomicity},
		{"KeyedConcurrentSameMessage", s.keyedConcurrent},
		{"BadInput", s.badInput},
		{"KeyedBadInput", s.keyedBadInput},
		{"TableNames", s.tableNames},
		{"TopicAdopt", s.topicAdopt},
		{"TopicResetRecreated", s.topicResetRecreated},
		{"TopicResetKeepsSealed", s.topicResetKeepsSealed},
		{"TopicGrowthAck", s.topicGrowthAck},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t)
		})
	}
}

type suite[Tx any] struct {
	open    func(t *testing.T) Env[Tx]
	scratch *atomic.Int64 // numbers the scratch fence keys of inTx
}

var errRollback = errors.New("fencetest: deliberate rollback")

// callTimeout bounds each call the suite makes: a store that blocks (a lock never released, a
// transaction left open) fails the case with a deadline error instead of hanging the binary.
const callTimeout = 10 * time.Second

// deadline returns a context that ends with t or after [callTimeout], whichever comes first.
func deadline(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), callTimeout)
	t.Cleanup(cancel)
	return ctx
}

// begin starts a transaction with env.Begin and rolls it back when t ends if it is still
// open, so that a failed case leaves no transaction for the store's own cleanup (a pool's
// Close, which waits for every connection) to wait on.
func begin[Tx any](t *testing.T, env Env[Tx], ctx context.Context) (Tx, func() error, func() error) {
	t.Helper()
	tx, commit, rollback, err := env.Begin(ctx)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	t.Cleanup(func() { _ = rollback() })
	return tx, commit, rollback
}

// owner is the claimant of the suite's claims and recoveries.
const owner = "fencetest"

func tok(era, epoch int64) fence.Token { return fence.Token{Era: era, Epoch: epoch} }

func key(topic string) fence.Key { return fence.Key{Group: "fencetest", Topic: topic, Partition: 3} }

func claim[Tx any](t *testing.T, env Env[Tx], k fence.Key, tk fence.Token) fence.State {
	t.Helper()
	st, err := env.Sink.Claim(deadline(t), k, tk, owner)
	if err != nil {
		t.Fatalf("Claim(%s, %s): %v", k, tk, err)
	}
	return st
}

func load[Tx any](t *testing.T, env Env[Tx], k fence.Key) fence.State {
	t.Helper()
	st, err := env.Sink.Load(deadline(t), k)
	if err != nil {
		t.Fatalf("Load(%s): %v", k, err)
	}
	return st
}

func wantState[Tx any](t *testing.T, env Env[Tx], k fence.Key, want fence.State) {
	t.Helper()
	if got := load(t, env, k); got != want {
		t.Fatalf("Load(%s) = %+v, want %+v", k, got, want)
	}
}

// apply runs Apply with fn writing each key of writes to its value, in order.
func apply[Tx any](t *testing.T, env Env[Tx], k fence.Key, tk fence.Token, pos int64, writes ...string) error {
	t.Helper()
	return env.Sink.Apply(deadline(t), k, tk, pos, pos, func(ctx context.Context, tx Tx) error {
		for i := 0; i+1 < len(writes); i += 2 {
			if err := env.Write(ctx, tx, writes[i], writes[i+1]); err != nil {
				return err
			}
		}
		return nil
	})
}

func mustApply[Tx any](t *testing.T, env Env[Tx], k fence.Key, tk fence.Token, pos int64, writes ...string) {
	t.Helper()
	if err := apply(t, env, k, tk, pos, writes...); err != nil {
		t.Fatalf("Apply(%s, %s, %d): %v", k, tk, pos, err)
	}
}

func read[Tx any](t *testing.T, env Env[Tx], key string) (string, bool) {
	t.Helper()
	v, ok, err := env.Read(deadline(t), key)
	if err != nil {
		t.Fatalf("Read(%q): %v", key, err)
	}
	return v, ok
}

func wantValue[Tx any](t *testing.T, env Env[Tx], key, want string) {
	t.Helper()
	if v, ok := read(t, env, key); !ok || v != want {
		t.Fatalf("Read(%q) = %q, %v; want %q, true", key, v, ok, want)
	}
}

func wantAbsent[Tx any](t *testing.T, env Env[Tx], key string) {
	t.Helper()
	if v, ok := read(t, env, key); ok {
		t.Fatalf("Read(%q) = %q: a write that must have been rolled back is visible", key, v)
	}
}

// wantStale checks that err is a *StaleError for k carrying stored and presented.
func wantStale(t *testing.T, err error, k fence.Key, stored, presented fence.Token) {
	t.Helper()
	if !errors.Is(err, fence.ErrStale) {
		t.Fatalf("error = %v, want ErrStale (stored %s, presented %s)", err, stored, presented)
	}
	var se *fence.StaleError
	if !errors.As(err, &se) {
		t.Fatalf("error %v is not a *fence.StaleError", err)
	}
	if se.Key != k || se.Stored != stored || se.Presented != presented {
		t.Fatalf("StaleError = {Key %s, Stored %s, Presented %s}, want {%s, %s, %s}",
			se.Key, se.Stored, se.Presented, k, stored, presented)
	}
}

func wantIs(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: error = %v, want %v", what, err, target)
	}
}

// inTx runs fn in one transaction of the store and commits it if fn returns nil. It uses
// Env.Begin when the store provides it, otherwise Apply on a fence key of its own.
func (s suite[Tx]) inTx(ctx context.Context, env Env[Tx], fn func(ctx context.Context, tx Tx) error) error {
	if env.Begin != nil {
		tx, commit, rollback, err := env.Begin(ctx)
		if err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		defer func() { _ = rollback() }() // also when fn stops the test; harmless after commit
		if err := fn(ctx, tx); err != nil {
			return err
		}
		return commit()
	}
	k := fence.Key{Group: "fencetest-scratch", Topic: fmt.Sprint(s.scratch.Add(1)), Partition: 0}
	return env.Sink.Apply(ctx, k, fence.Token{}, 0, 0, fn)
}

func (s suite[Tx]) monotonicClaims(t *testing.T) {
	env := s.open(t)
	k := key("monotonic")
	wantState(t, env, k, fence.State{Position: fence.NoPosition})
	for _, e := range []int64{0, 1, 2, 5, 9, 9} { // the last one: an equal claim is accepted
		got := claim(t, env, k, tok(0, e))
		if want := (fence.State{Token: tok(0, e), Position: fence.NoPosition, Claimant: owner}); got != want {
			t.Fatalf("Claim(%s) = %+v, want %+v", tok(0, e), got, want)
		}
		wantState(t, env, k, fence.State{Token: tok(0, e), Position: fence.NoPosition, Claimant: owner})
	}
	mustApply(t, env, k, tok(0, 9), 3)
	if got, want := claim(t, env, k, tok(0, 10)), (fence.State{Token: tok(0, 10), Position: 3, Claimant: owner}); got != want {
		t.Fatalf("Claim after an apply = %+v, want %+v", got, want)
	}
	// A write under a higher token than the stored one is refused: writes happen only under
	// a claimed token.
	err := apply(t, env, k, tok(0, 12), 4, "mono/12", "x")
	wantIs(t, "Apply under an unclaimed higher token", err, fence.ErrNotClaimed)
	wantAbsent(t, env, "mono/12")
	wantState(t, env, k, fence.State{Token: tok(0, 10), Position: 3, Claimant: owner})
}

func (s suite[Tx]) equalTokenManyBatches(t *testing.T) {
	env := s.open(t)
	k := key("equal")
	claim(t, env, k, tok(0, 7))
	// Kafka offsets can have gaps (compaction, transaction markers): any rising position is fine.
	positions := []int64{0, 1, 2, 5, 6, 100, 101, 250, 1 << 40}
	for _, p := range positions {
		mustApply(t, env, k, tok(0, 7), p, fmt.Sprintf("eq/%d", p), "v")
		wantState(t, env, k, fence.State{Token: tok(0, 7), Position: p, Claimant: owner})
	}
	for _, p := range positions {
		wantValue(t, env, fmt.Sprintf("eq/%d", p), "v")
	}
}

func (s suite[Tx]) lowerTokenRefused(t *testing.T) {
	env := s.open(t)
	k := key("lower")
	claim(t, env, k, tok(0, 5))
	mustApply(t, env, k, tok(0, 5), 10, "lower/a", "owner")
	want := fence.State{Token: tok(0, 5), Position: 10, Claimant: owner}

	_, err := env.Sink.Claim(deadline(t), k, tok(0, 4), owner)
	wantStale(t, err, k, tok(0, 5), tok(0, 4))
	wantState(t, env, k, want)

	err = apply(t, env, k, tok(0, 4), 11, "lower/a", "zombie", "lower/b", "zombie")
	wantStale(t, err, k, tok(0, 5), tok(0, 4))
	wantState(t, env, k, want)
	wantValue(t, env, "lower/a", "owner")
	wantAbsent(t, env, "lower/b")

	// The zero token (no owner) is lower than any owner's.
	_, err = env.Sink.Claim(deadline(t), k, fence.Token{}, owner)
	wantStale(t, err, k, tok(0, 5), fence.Token{})
	wantState(t, env, k, want)
}

func (s suite[Tx]) laterEraNotInvented(t *testing.T) {
	env := s.open(t)
	k := key("era")
	_, err := env.Sink.Claim(deadline(t), k, tok(1, 0), owner)
	wantIs(t, "Claim of era 1 on a fresh fence", err, fence.ErrInvalid)
	wantState(t, env, k, fence.State{Position: fence.NoPosition})

	claim(t, env, k, tok(0, 3))
	err = apply(t, env, k, tok(1, 0), 0, "era/x", "v")
	wantIs(t, "Apply of era 1 over era 0", err, fence.ErrInvalid)
	wantAbsent(t, env, "era/x")
	wantState(t, env, k, fence.State{Token: tok(0, 3), Position: fence.NoPosition, Claimant: owner})

	nt, err := env.Sink.Recover(deadline(t), k, tok(0, 3), 1, owner, "test: era advance")
	if err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if nt != tok(1, 1) {
		t.Fatalf("Recover = %s, want 1.1", nt)
	}
	_, err = env.Sink.Claim(deadline(t), k, tok(2, 0), owner)
	wantIs(t, "Claim of era 2 over era 1", err, fence.ErrInvalid)
	wantState(t, env, k, fence.State{Token: tok(1, 1), Position: fence.NoPosition, Claimant: owner})
}

func (s suite[Tx]) resumePosition(t *testing.T) {
	env := s.open(t)
	k := key("resume")
	if got := load(t, env, k); got.Token != (fence.Token{}) || got.Position != fence.NoPosition {
		t.Fatalf("Load of a new key = %+v, want the zero token and NoPosition", got)
	}
	if got := claim(t, env, k, tok(0, 1)); got.Position != fence.NoPosition {
		t.Fatalf("Claim of a new key: position %d, want NoPosition", got.Position)
	}
	for p := int64(0); p < 5; p++ {
		mustApply(t, env, k, tok(0, 1), p)
	}
	// A new owner resumes after the last applied position, whatever Kafka's committed offset says.
	if got, want := claim(t, env, k, tok(0, 2)), (fence.State{Token: tok(0, 2), Position: 4, Claimant: owner}); got != want {
		t.Fatalf("Claim by the next owner = %+v, want %+v", got, want)
	}
	// Other keys are independent: same group and topic, another partition.
	other := k
	other.Partition++
	wantState(t, env, other, fence.State{Position: fence.NoPosition})
}

func (s suite[Tx]) duplicates(t *testing.T) {
	env := s.open(t)
	k := key("dup")
	claim(t, env, k, tok(0, 5))
	mustApply(t, env, k, tok(0, 5), 10, "dup/10", "first")
	want := fence.State{Token: tok(0, 5), Position: 10, Claimant: owner}
	for _, p := range []int64{10, 9, 0} {
		err := apply(t, env, k, tok(0, 5), p, "dup/10", "again", fmt.Sprintf("dup/new%d", p), "v")
		wantIs(t, fmt.Sprintf("Apply at %d after 10", p), err, fence.ErrDuplicate)
		wantValue(t, env, "dup/10", "first")
		wantAbsent(t, env, fmt.Sprintf("dup/new%d", p))
		wantState(t, env, k, want)
	}
	// A higher token is not claimed, whatever the position: nothing is committed.
	err := apply(t, env, k, tok(0, 6), 10, "dup/hi", "v")
	wantIs(t, "Apply at 10 under a higher token", err, fence.ErrNotClaimed)
	wantAbsent(t, env, "dup/hi")
	wantState(t, env, k, want)
	// A lower token at an applied position is stale, not a duplicate: a zombie must stop,
	// not skip the batch and carry on.
	err = apply(t, env, k, tok(0, 4), 10, "dup/lo", "v")
	wantStale(t, err, k, tok(0, 5), tok(0, 4))
	wantAbsent(t, env, "dup/lo")
	wantState(t, env, k, want)
}

// equalTokenOneClaimant: a token is held by one claimant. Another claimant presenting the
// same token is refused as stale (the equal-token race of a recreated group or a replaced
// static member: two workers assigned at the same generation); the holder re-claims freely.
func (s suite[Tx]) equalTokenOneClaimant(t *testing.T) {
	env := s.open(t)
	ctx := deadline(t)
	k := key("one-claimant")
	claim(t, env, k, tok(0, 4))
	mustApply(t, env, k, tok(0, 4), 0)
	if st, err := env.Sink.Claim(ctx, k, tok(0, 5), "n"); err != nil || st != (fence.State{Token: tok(0, 5), Position: 0, Claimant: "n"}) {
		t.Fatalf("Claim(0.5) by n = %+v, %v", st, err)
	}
	_, err := env.Sink.Claim(ctx, k, tok(0, 5), "o")
	wantStale(t, err, k, tok(0, 5), tok(0, 5))
	if !strings.Contains(err.Error(), "another claimant") {
		t.Errorf("refusal of an equal token held by another claimant says %q; want it to say so", err)
	}
	wantState(t, env, k, fence.State{Token: tok(0, 5), Position: 0, Claimant: "n"})
	// The holder re-claims (a lost reply, a retry): accepted, nothing changes.
	if st, err := env.Sink.Claim(ctx, k, tok(0, 5), "n"); err != nil || st != (fence.State{Token: tok(0, 5), Position: 0, Claimant: "n"}) {
		t.Fatalf("re-claim by the holder = %+v, %v", st, err)
	}
	// A higher token takes it from anyone; a recovery hands it to its claimant.
	claim(t, env, k, tok(0, 6))
	wantState(t, env, k, fence.State{Token: tok(0, 6), Position: 0, Claimant: owner})
	if _, err := env.Sink.Recover(ctx, k, tok(0, 6), 2, "r", "fencetest: recovery"); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	wantState(t, env, k, fence.State{Token: tok(1, 2), Position: 0, Claimant: "r"})
	_, err = env.Sink.Claim(ctx, k, tok(1, 2), owner)
	wantStale(t, err, k, tok(1, 2), tok(1, 2))
	if _, err := env.Sink.Claim(ctx, k, tok(1, 2), "r"); err != nil {
		t.Fatalf("re-claim by the recoverer: %v", err)
	}
	// A fence never claimed holds the zero token for nobody: anyone may claim it.
	k2 := key("one-claimant-zero")
	if st, err := env.Sink.Claim(ctx, k2, fence.Token{}, "z"); err != nil || st.Claimant != "z" {
		t.Fatalf("Claim of the zero token of a new fence = %+v, %v", st, err)
	}
	_, err = env.Sink.Claim(ctx, k2, fence.Token{}, "y")
	wantStale(t, err, k2, fence.Token{}, fence.Token{})
	for _, bad := range []string{"", "a\x00b"} {
		_, err := env.Sink.Claim(ctx, k2, tok(0, 9), bad)
		wantIs(t, fmt.Sprintf("Claim with claimant %q", bad), err, fence.ErrInvalid)
		_, err = env.Sink.Recover(ctx, k2, fence.Token{}, 9, bad, "r")
		wantIs(t, fmt.Sprintf("Recover with claimant %q", bad), err, fence.ErrInvalid)
	}
}

// claimRaceOneClaimant: many claimants race to claim the same token; exactly one wins.
func (s suite[Tx]) claimRaceOneClaimant(t *testing.T) {
	env := s.open(t)
	ctx := deadline(t)
	k := key("claim-race")
	claim(t, env, k, tok(0, 4))
	const n = 8
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = env.Sink.Claim(ctx, k, tok(0, 5), fmt.Sprintf("c%d", i))
		}()
	}
	wg.Wait()
	winner := ""
	for i, err := range errs {
		switch {
		case err == nil && winner == "":
			winner = fmt.Sprintf("c%d", i)
		case err == nil:
			t.Fatalf("both %s and c%d claimed token 0.5", winner, i)
		default:
			wantStale(t, err, k, tok(0, 5), tok(0, 5))
		}
	}
	if winner == "" {
		t.Fatalf("no claimant won: %v", errs)
	}
	wantState(t, env, k, fence.State{Token: tok(0, 5), Position: fence.NoPosition, Claimant: winner})
}

// writeNeedsClaimedToken: a write under a token higher than the stored one is refused with
// ErrNotClaimed and changes nothing; stale still wins.
func (s suite[Tx]) writeNeedsClaimedToken(t *testing.T) {
	env := s.open(t)
	k := key("not-claimed")
	err := apply(t, env, k, tok(0, 1), 0, "nc/a", "v")
	wantIs(t, "Apply on a fence never claimed", err, fence.ErrNotClaimed)
	wantState(t, env, k, fence.State{Position: fence.NoPosition})
	claim(t, env, k, tok(0, 3))
	mustApply(t, env, k, tok(0, 3), 5)
	err = apply(t, env, k, tok(0, 4), 6, "nc/a", "v")
	wantIs(t, "Apply under a higher unclaimed token", err, fence.ErrNotClaimed)
	wantAbsent(t, env, "nc/a")
	wantState(t, env, k, fence.State{Token: tok(0, 3), Position: 5, Claimant: owner})
}

// overlapRefused: a batch that spans the stored position (part of it applied before) is
// refused with ErrOverlap and changes nothing; the suffix then applies. Stale wins over it.
func (s suite[Tx]) overlapRefused(t *testing.T) {
	env := s.open(t)
	ctx := deadline(t)
	k := key("overlap")
	claim(t, env, k, tok(0, 5))
	if err := env.Sink.Apply(ctx, k, tok(0, 5), 1, 30, func(ctx context.Context, tx Tx) error {
		return env.Write(ctx, tx, "ov/1-30", "v")
	}); err != nil {
		t.Fatalf("Apply 1..30: %v", err)
	}
	for _, first := range []int64{1, 30} {
		err := env.Sink.Apply(ctx, k, tok(0, 5), first, 50, func(ctx context.Context, tx Tx) error {
			return env.Write(ctx, tx, "ov/overlap", "v")
		})
		wantIs(t, fmt.Sprintf("Apply %d..50 after 30", first), err, fence.ErrOverlap)
		if errors.Is(err, fence.ErrDuplicate) {
			t.Fatalf("an overlap is not a duplicate: skipping it would lose 31..50: %v", err)
		}
		wantAbsent(t, env, "ov/overlap")
		wantState(t, env, k, fence.State{Token: tok(0, 5), Position: 30, Claimant: owner})
	}
	// Stale wins over overlap.
	claim(t, env, k, tok(0, 6))
	noop := func(context.Context, Tx) error { return nil }
	err := env.Sink.Apply(ctx, k, tok(0, 5), 20, 50, noop)
	wantStale(t, err, k, tok(0, 6), tok(0, 5))
	// The suffix applies, with a gap (offsets are not contiguous).
	if err := env.Sink.Apply(ctx, k, tok(0, 6), 33, 50, func(ctx context.Context, tx Tx) error {
		return env.Write(ctx, tx, "ov/33-50", "v")
	}); err != nil {
		t.Fatalf("Apply 33..50: %v", err)
	}
	wantState(t, env, k, fence.State{Token: tok(0, 6), Position: 50, Claimant: owner})
	err = env.Sink.Apply(ctx, k, tok(0, 6), 60, 59, noop)
	wantIs(t, "Apply 60..59", err, fence.ErrInvalid)
}

// raceHighestTokenWins runs owners with rising epochs that claim in turn while the earlier
// ones keep applying, each commit logging its token at its (unique) position. Positions commit
// in rising order, so the log in position order is the commit order, and its tokens must never
// go down.
func (s suite[Tx]) raceHighestTokenWins(t *testing.T) {
	env := s.open(t)
	k := key("race")
	const owners, batches, zombieBatches = 8, 25, 5
	type attempt struct {
		owner    int
		pos      int64
		afterTop bool // started after the highest owner's claim returned
		err      error
	}
	var (
		next      atomic.Int64 // the positions: every attempt gets its own
		mu        sync.Mutex
		attempts  []attempt
		claimErrs = make([]error, owners)
		turn      = make([]chan struct{}, owners+1)
		wg        sync.WaitGroup
	)
	for i := range turn {
		turn[i] = make(chan struct{})
	}
	allClaimed := turn[owners]
	ctx := deadline(t)
	for i := range owners {
		wg.Go(func() {
			tk := tok(0, int64(10+i))
			do := func(afterTop bool) error {
				p := next.Add(1) - 1
				err := env.Sink.Apply(ctx, k, tk, p, p, func(ctx context.Context, tx Tx) error {
					return env.Write(ctx, tx, fmt.Sprintf("log/%d", p), tk.String())
				})
				mu.Lock()
				attempts = append(attempts, attempt{owner: i, pos: p, afterTop: afterTop, err: err})
				mu.Unlock()
				return err
			}
			<-turn[i]
			_, claimErrs[i] = env.Sink.Claim(ctx, k, tk, owner)
			if claimErrs[i] == nil {
				_ = do(false)
			}
			close(turn[i+1]) // the next owner takes over while this one keeps writing
			if claimErrs[i] != nil {
				return
			}
			for range batches {
				_ = do(false)
			}
			<-allClaimed
			for range zombieBatches {
				_ = do(true)
			}
		})
	}
	close(turn[0])
	wg.Wait()

	for i, err := range claimErrs {
		if err != nil {
			t.Fatalf("owner %d: Claim in rising order failed: %v", i, err)
		}
	}
	top := tok(0, 10+owners-1)
	log := map[int64]fence.Token{} // committed position -> token
	stale := make([]bool, owners)
	slices.SortFunc(attempts, func(a, b attempt) int { return cmp.Compare(a.pos, b.pos) })
	for _, a := range attempts {
		tk := tok(0, int64(10+a.owner))
		v, ok := read(t, env, fmt.Sprintf("log/%d", a.pos))
		switch {
		case a.err == nil:
			if !ok || v != tk.String() {
				t.Fatalf("owner %d: Apply at %d succeeded but its log entry reads %q, %v", a.owner, a.pos, v, ok)
			}
			log[a.pos] = tk
		case ok:
			t.Fatalf("owner %d: Apply at %d failed (%v) but its log entry %q is visible", a.owner, a.pos, a.err, v)
		case errors.Is(a.err, fence.ErrStale):
			stale[a.owner] = true
			if tk == top {
				t.Fatalf("the highest owner was refused as stale at %d: %v", a.pos, a.err)
			}
		case errors.Is(a.err, fence.ErrDuplicate):
		default:
			t.Fatalf("owner %d: Apply at %d: unexpected error %v", a.owner, a.pos, a.err)
		}
		if a.afterTop && tk != top && !errors.Is(a.err, fence.ErrStale) {
			t.Fatalf("owner %d (token %s) wrote at %d after %s had claimed: err = %v, want ErrStale", a.owner, tk, a.pos, top, a.err)
		}
	}
	positions := slices.Sorted(maps.Keys(log))
	if len(positions) == 0 {
		t.Fatal("no Apply succeeded")
	}
	for i := 1; i < len(positions); i++ {
		if log[positions[i]].Compare(log[positions[i-1]]) < 0 {
			t.Fatalf("token %s committed at %d after token %s had committed at %d",
				log[positions[i]], positions[i], log[positions[i-1]], positions[i-1])
		}
	}
	// Once refused, an owner stays refused: no success of it may follow its first stale error.
	for i := range owners {
		refusedAt := int64(-1)
		for _, a := range attempts { // sorted by position
			if a.owner != i {
				continue
			}
			if errors.Is(a.err, fence.ErrStale) && refusedAt < 0 {
				refusedAt = a.pos
			}
			if a.err == nil && refusedAt >= 0 {
				t.Fatalf("owner %d was refused at %d yet committed at %d", i, refusedAt, a.pos)
			}
		}
	}
	if !slices.Contains(stale[:owners-1], true) {
		t.Fatal("no lower owner was ever refused: the race did not happen")
	}
	wantState(t, env, k, fence.State{Token: top, Position: positions[len(positions)-1], Claimant: owner})
}

func (s suite[Tx]) atomicUserWriteFails(t *testing.T) {
	env := s.open(t)
	k := key("atomic-write")
	claim(t, env, k, tok(0, 2))
	mustApply(t, env, k, tok(0, 2), 0)
	want := fence.State{Token: tok(0, 2), Position: 0, Claimant: owner}
	err := apply(t, env, k, tok(0, 2), 1, "aw/before", "v", "aw/failing", "fail")
	if err == nil {
		t.Fatal("Apply succeeded although the user write failed")
	}
	wantState(t, env, k, want)
	wantAbsent(t, env, "aw/before")
	wantAbsent(t, env, "aw/failing")
	// A failed user write under a higher token must not raise the token either.
	if err := apply(t, env, k, tok(0, 3), 1, "aw/failing", "fail"); err == nil {
		t.Fatal("Apply succeeded although the user write failed")
	}
	wantState(t, env, k, want)
	// The position was not consumed: the batch can be applied once the write succeeds.
	mustApply(t, env, k, tok(0, 2), 1, "aw/before", "v")
	wantState(t, env, k, fence.State{Token: tok(0, 2), Position: 1, Claimant: owner})
}

func (s suite[Tx]) atomicFnError(t *testing.T) {
	env := s.open(t)
	k := key("atomic-fn")
	claim(t, env, k, tok(0, 2))
	err := env.Sink.Apply(deadline(t), k, tok(0, 2), 0, 0, func(ctx context.Context, tx Tx) error {
		if err := env.Write(ctx, tx, "af/x", "v"); err != nil {
			return err
		}
		return errRollback
	})
	wantIs(t, "Apply with fn failing", err, errRollback)
	wantAbsent(t, env, "af/x")
	wantState(t, env, k, fence.State{Token: tok(0, 2), Position: fence.NoPosition, Claimant: owner})
}

func (s suite[Tx]) atomicStaleWriteInvisible(t *testing.T) {
	env := s.open(t)
	k := key("atomic-stale")
	claim(t, env, k, tok(0, 9))
	// A store may check before or after running fn; either way nothing may become visible.
	err := env.Sink.Apply(deadline(t), k, tok(0, 8), 0, 0, func(ctx context.Context, tx Tx) error {
		return env.Write(ctx, tx, "as/x", "zombie")
	})
	wantStale(t, err, k, tok(0, 9), tok(0, 8))
	wantAbsent(t, env, "as/x")
	wantState(t, env, k, fence.State{Token: tok(0, 9), Position: fence.NoPosition, Claimant: owner})
}

func (s suite[Tx]) needBegin(t *testing.T) Env[Tx] {
	t.Helper()
	env := s.open(t)
	if env.Begin == nil {
		t.Skip("Env.Begin is nil: the store offers no caller-held transaction")
	}
	return env
}

func (s suite[Tx]) advanceInCallerTx(t *testing.T) {
	env := s.needBegin(t)
	ctx := deadline(t)
	k := key("advance")
	claim(t, env, k, tok(0, 5))

	// Stale: refused, and the caller rolls back.
	tx, _, rollback := begin(t, env, ctx)
	wantStale(t, env.Sink.Advance(ctx, tx, k, tok(0, 4), 0, 0), k, tok(0, 5), tok(0, 4))
	if err := rollback(); err != nil {
		t.Fatalf("rollback: %v", err)
	}
	wantState(t, env, k, fence.State{Token: tok(0, 5), Position: fence.NoPosition, Claimant: owner})

	// Not claimed: a higher token is refused.
	tx, _, rollback = begin(t, env, ctx)
	wantIs(t, "Advance under an unclaimed token", env.Sink.Advance(ctx, tx, k, tok(0, 6), 0, 0), fence.ErrNotClaimed)
	_ = rollback()
	claim(t, env, k, tok(0, 6))

	// Rolled back: neither the advance nor the user write happened.
	tx, _, rollback = begin(t, env, ctx)
	if err := env.Sink.Advance(ctx, tx, k, tok(0, 6), 3, 3); err != nil {
		t.Fatalf("Advance: %v", err)
	}
	if err := env.Write(ctx, tx, "adv/rolled", "v"); err != nil {
		t.Fatal(err)
	}
	if err := rollback(); err != nil {
		t.Fatalf("rollback: %v", err)
	}
	wantState(t, env, k, fence.State{Token: tok(0, 6), Position: fence.NoPosition, Claimant: owner})
	wantAbsent(t, env, "adv/rolled")

	// Committed: two advances in one transaction, then visible together with the user write.
	tx, commit, _ := begin(t, env, ctx)
	for _, p := range []int64{3, 4} {
		if err := env.Sink.Advance(ctx, tx, k, tok(0, 6), p, p); err != nil {
			t.Fatalf("Advance to %d: %v", p, err)
		}
	}
	if err := env.Write(ctx, tx, "adv/committed", "v"); err != nil {
		t.Fatal(err)
	}
	if err := commit(); err != nil {
		t.Fatalf("commit: %v", err)
	}
	wantState(t, env, k, fence.State{Token: tok(0, 6), Position: 4, Claimant: owner})
	wantValue(t, env, "adv/committed", "v")

	// A duplicate through Advance.
	tx, _, rollback = begin(t, env, ctx)
	wantIs(t, "Advance to 4 again", env.Sink.Advance(ctx, tx, k, tok(0, 6), 4, 4), fence.ErrDuplicate)
	_ = rollback()
	wantState(t, env, k, fence.State{Token: tok(0, 6), Position: 4, Claimant: owner})

	// Invalid input through Advance.
	tx, _, rollback = begin(t, env, ctx)
	wantIs(t, "Advance to a negative position", env.Sink.Advance(ctx, tx, k, tok(0, 6), -1, -1), fence.ErrInvalid)
	_ = rollback()
	wantState(t, env, k, fence.State{Token: tok(0, 6), Position: 4, Claimant: owner})
}

// advanceHoldsKey checks that a transaction that advanced a fence holds it until it ends: a
// claim or write under another token waits for it and is judged against what it committed.
// That is what stops a delayed write that began before a takeover from committing after it.
func (s suite[Tx]) advanceHoldsKey(t *testing.T) {
	env := s.needBegin(t)
	ctx := deadline(t)
	k := key("held")
	claim(t, env, k, tok(0, 5))

	// The old owner advanced and still holds its transaction; the new owner claims meanwhile.
	tx, commit, _ := begin(t, env, ctx)
	if err := env.Sink.Advance(ctx, tx, k, tok(0, 5), 10, 10); err != nil {
		t.Fatalf("Advance: %v", err)
	}
	if err := env.Write(ctx, tx, "held/10", "old owner"); err != nil {
		t.Fatal(err)
	}
	type result struct {
		st  fence.State
		err error
	}
	claimed := make(chan result, 1)
	go func() {
		st, err := env.Sink.Claim(ctx, k, tok(0, 6), owner)
		claimed <- result{st, err}
	}()
	// Give the claim time to reach the fence before the commit. The assertions hold for a
	// correct store whatever the timing; a store that does not serialize fails them only
	// when the claim gets there first, which this pause makes likely.
	time.Sleep(50 * time.Millisecond)
	if err := commit(); err != nil {
		t.Fatalf("commit: %v", err)
	}
	r := <-claimed
	if r.err != nil {
		t.Fatalf("Claim during an open advance: %v", r.err)
	}
	if want := (fence.State{Token: tok(0, 6), Position: 10, Claimant: owner}); r.st != want {
		t.Fatalf("Claim during an open advance = %+v, want %+v (it must see the advance that committed first)", r.st, want)
	}
	wantState(t, env, k, fence.State{Token: tok(0, 6), Position: 10, Claimant: owner})
	wantValue(t, env, "held/10", "old owner")

	// The other way round: the new owner's advance is open, a zombie's Apply must wait and
	// then be refused.
	claim(t, env, k, tok(0, 7))
	tx, commit, _ = begin(t, env, ctx)
	if err := env.Sink.Advance(ctx, tx, k, tok(0, 7), 11, 11); err != nil {
		t.Fatalf("Advance: %v", err)
	}
	applied := make(chan error, 1)
	go func() {
		applied <- env.Sink.Apply(ctx, k, tok(0, 6), 12, 12, func(ctx context.Context, tx Tx) error {
			return env.Write(ctx, tx, "held/12", "zombie")
		})
	}()
	time.Sleep(50 * time.Millisecond) // as above: timing only makes a broken store likelier to fail
	if err := commit(); err != nil {
		t.Fatalf("commit: %v", err)
	}
	wantStale(t, <-applied, k, tok(0, 7), tok(0, 6))
	wantAbsent(t, env, "held/12")
	wantState(t, env, k, fence.State{Token: tok(0, 7), Position: 11, Claimant: owner})
}

func (s suite[Tx]) durability(t *testing.T) {
	env := s.open(t)
	if env.Reopen == nil {
		t.Skip("Env.Reopen is nil: the store is not durable")
	}
	ctx := deadline(t)
	k, k2 := key("durable"), key("durable-2")
	claim(t, env, k, tok(0, 3))
	mustApply(t, env, k, tok(0, 3), 7, "dur/7", "v7")
	if _, err := env.Sink.Recover(ctx, k, tok(0, 3), 1, owner, "test: group recreated"); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	mustApply(t, env, k, tok(1, 1), 8, "dur/8", "v8")
	claim(t, env, k2, tok(0, 40))
	if env.Keyed != nil {
		err := s.inTx(ctx, env, func(ctx context.Context, tx Tx) error {
			v, err := env.Keyed.Admit(ctx, tx, "dur", "e1", tok(0, 2), 5)
			if err == nil && v != fence.Admitted {
				err = fmt.Errorf("verdict %s, want admitted", v)
			}
			return err
		})
		if err != nil {
			t.Fatalf("Admit: %v", err)
		}
	}

	env = env.Reopen(t)

	wantState(t, env, k, fence.State{Token: tok(1, 1), Position: 8, Claimant: owner})
	wantState(t, env, k2, fence.State{Token: tok(0, 40), Position: fence.NoPosition, Claimant: owner})
	wantValue(t, env, "dur/7", "v7")
	wantValue(t, env, "dur/8", "v8")
	recs, err := env.Sink.Recoveries(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].From != tok(0, 3) || recs[0].To != tok(1, 1) || recs[0].Reason != "test: group recreated" {
		t.Fatalf("Recoveries after reopen = %+v", recs)
	}
	_, err = env.Sink.Claim(ctx, k, tok(0, 99), owner)
	wantStale(t, err, k, tok(1, 1), tok(0, 99))
	wantIs(t, "Apply at 8 after reopen", apply(t, env, k, tok(1, 1), 8), fence.ErrDuplicate)
	if env.Keyed != nil {
		var v fence.Verdict
		err := s.inTx(ctx, env, func(ctx context.Context, tx Tx) (err error) {
			v, err = env.Keyed.Admit(ctx, tx, "dur", "e1", tok(0, 2), 5)
			return err
		})
		if err != nil || v != fence.Duplicate {
			t.Fatalf("Admit after reopen = %s, %v; want duplicate", v, err)
		}
	}
}

func (s suite[Tx]) regressionAndRecover(t *testing.T) {
	env := s.open(t)
	ctx := deadline(t)
	k := key("regress")
	claim(t, env, k, tok(0, 10))
	mustApply(t, env, k, tok(0, 10), 5, "reg/5", "v")

	// The group was recreated: its current owner presents a low epoch. The sink cannot tell it
	// from a zombie, so it refuses it; only Recover may let it in.
	_, err := env.Sink.Claim(ctx, k, tok(0, 2), owner)
	wantStale(t, err, k, tok(0, 10), tok(0, 2))
	wantStale(t, apply(t, env, k, tok(0, 2), 6, "reg/6", "v"), k, tok(0, 10), tok(0, 2))
	wantAbsent(t, env, "reg/6")

	_, err = env.Sink.Recover(ctx, k, tok(0, 9), 2, owner, "test: wrong expectation")
	wantIs(t, "Recover with the wrong expected token", err, fence.ErrConflict)
	_, err = env.Sink.Recover(ctx, k, tok(0, 10), 2, owner, "")
	wantIs(t, "Recover without a reason", err, fence.ErrInvalid)
	wantState(t, env, k, fence.State{Token: tok(0, 10), Position: 5, Claimant: owner})
	if recs, err := env.Sink.Recoveries(ctx, k); err != nil || len(recs) != 0 {
		t.Fatalf("Recoveries after failed recoveries = %+v, %v; want none", recs, err)
	}

	nt, err := env.Sink.Recover(ctx, k, tok(0, 10), 2, owner, "test: group recreated")
	if err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if nt != tok(1, 2) {
		t.Fatalf("Recover = %s, want 1.2", nt)
	}
	wantState(t, env, k, fence.State{Token: tok(1, 2), Position: 5, Claimant: owner})
	recs, err := env.Sink.Recoveries(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 {
		t.Fatalf("Recoveries = %+v, want one", recs)
	}
	if r := recs[0]; r.Key != k || r.From != tok(0, 10) || r.To != tok(1, 2) || r.Reason != "test: group recreated" {
		t.Fatalf("Recovery = %+v", r)
	}

	// The compare-and-set: the same recovery again loses.
	_, err = env.Sink.Recover(ctx, k, tok(0, 10), 3, owner, "test: repeated")
	wantIs(t, "Recover against a replaced token", err, fence.ErrConflict)

	// Every old-era token is now refused, even with a higher epoch.
	for _, old := range []fence.Token{tok(0, 2), tok(0, 10), tok(0, 11), tok(0, 1<<40)} {
		_, err := env.Sink.Claim(ctx, k, old, owner)
		wantStale(t, err, k, tok(1, 2), old)
		wantStale(t, apply(t, env, k, old, 6, "reg/old", "v"), k, tok(1, 2), old)
	}
	wantAbsent(t, env, "reg/old")

	// The recovered owner resumes where the fence stood and writes on.
	if got, want := claim(t, env, k, tok(1, 2)), (fence.State{Token: tok(1, 2), Position: 5, Claimant: owner}); got != want {
		t.Fatalf("Claim by the recovered owner = %+v, want %+v", got, want)
	}
	mustApply(t, env, k, tok(1, 2), 6, "reg/6", "new era")
	claim(t, env, k, tok(1, 3)) // the new era's next owner
	wantState(t, env, k, fence.State{Token: tok(1, 3), Position: 6, Claimant: owner})
	wantValue(t, env, "reg/6", "new era")

	if recs, _ := env.Sink.Recoveries(ctx, key("regress-other")); len(recs) != 0 {
		t.Fatalf("Recoveries of another key = %+v", recs)
	}
}

func (s suite[Tx]) recoverConcurrent(t *testing.T) {
	env := s.open(t)
	ctx := deadline(t)
	k := key("recover-race")
	claim(t, env, k, tok(0, 10))
	const n = 6
	errs := make([]error, n)
	tokens := make([]fence.Token, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			tokens[i], errs[i] = env.Sink.Recover(ctx, k, tok(0, 10), int64(i+1), owner, fmt.Sprintf("test: racer %d", i))
		})
	}
	close(start)
	wg.Wait()
	won := -1
	for i, err := range errs {
		switch {
		case err == nil && won >= 0:
			t.Fatalf("two recoveries from 0.10 succeeded: %s and %s", tokens[won], tokens[i])
		case err == nil:
			won = i
		case !errors.Is(err, fence.ErrConflict):
			t.Fatalf("Recover: %v, want nil or ErrConflict", err)
		}
	}
	if won < 0 {
		t.Fatal("no recovery succeeded")
	}
	wantState(t, env, k, fence.State{Token: tokens[won], Position: fence.NoPosition, Claimant: owner})
	recs, err := env.Sink.Recoveries(ctx, k)
	if err != nil || len(recs) != 1 || recs[0].To != tokens[won] {
		t.Fatalf("Recoveries = %+v, %v; want the one winner %s", recs, err, tokens[won])
	}
}

func (s suite[Tx]) needKeyed(t *testing.T) Env[Tx] {
	t.Helper()
	env := s.open(t)
	if env.Keyed == nil {
		t.Skip("Env.Keyed is nil: the store has no keyed fences")
	}
	return env
}

// admit admits in a transaction of its own and returns the verdict.
func (s suite[Tx]) admit(t *testing.T, env Env[Tx], scope, id string, tk fence.Token, seq int64) fence.Verdict {
	t.Helper()
	var v fence.Verdict
	err := s.inTx(deadline(t), env, func(ctx context.Context, tx Tx) (err error) {
		v, err = env.Keyed.Admit(ctx, tx, scope, id, tk, seq)
		return err
	})
	if err != nil {
		t.Fatalf("Admit(%s, %s, %s, %d): %v", scope, id, tk, seq, err)
	}
	return v
}

func (s suite[Tx]) keyedVerdicts(t *testing.T) {
	env := s.needKeyed(t)
	steps := []struct {
		tk   fence.Token
		seq  int64
		want fence.Verdict
	}{
		{tok(0, 5), 1, fence.Admitted},
		{tok(0, 5), 1, fence.Duplicate},
		{tok(0, 5), 0, fence.Duplicate},
		{tok(0, 5), 2, fence.Admitted},
		{tok(0, 5), 7, fence.Admitted}, // sequences may have gaps
		{tok(0, 4), 90, fence.Stale},
		{tok(0, 5), 7, fence.Duplicate}, // the stale one stored nothing
		{tok(0, 6), 0, fence.Admitted},  // a higher token with a lower sequence
		{tok(0, 5), 100, fence.Stale},
		{tok(0, 6), 0, fence.Duplicate},
		{tok(1, 0), 0, fence.Admitted}, // a later era outranks every epoch
		{tok(0, 1000), 1000, fence.Stale},
	}
	for i, st := range steps {
		if got := s.admit(t, env, "orders", "o-1", st.tk, st.seq); got != st.want {
			t.Fatalf("step %d: Admit(%s, %d) = %s, want %s", i, st.tk, st.seq, got, st.want)
		}
	}
}

func (s suite[Tx]) keyedIsolation(t *testing.T) {
	env := s.needKeyed(t)
	if v := s.admit(t, env, "orders", "o-1", tok(0, 9), 9); v != fence.Admitted {
		t.Fatalf("first admit = %s", v)
	}
	for _, c := range []struct{ scope, id string }{{"orders", "o-2"}, {"payments", "o-1"}, {"orders2", "o-1"}, {"order", "so-1"}} {
		if v := s.admit(t, env, c.scope, c.id, tok(0, 1), 0); v != fence.Admitted {
			t.Fatalf("Admit(%s, %s) = %s: entities are not isolated", c.scope, c.id, v)
		}
	}
	if v := s.admit(t, env, "orders", "o-1", tok(0, 9), 9); v != fence.Duplicate {
		t.Fatalf("re-admit = %s, want duplicate", v)
	}
}

func (s suite[Tx]) keyedAtomicity(t *testing.T) {
	env := s.needKeyed(t)
	ctx := deadline(t)
	err := s.inTx(ctx, env, func(ctx context.Context, tx Tx) error {
		v, err := env.Keyed.Admit(ctx, tx, "inbox", "m", tok(0, 1), 1)
		if err != nil {
			return err
		}
		if v != fence.Admitted {
			return fmt.Errorf("verdict %s, want admitted", v)
		}
		if err := env.Write(ctx, tx, "keyed/effect", "v"); err != nil {
			return err
		}
		return errRollback
	})
	wantIs(t, "rolled back admission", err, errRollback)
	wantAbsent(t, env, "keyed/effect")
	// The rolled back transaction left no admission behind: the message is new again.
	err = s.inTx(ctx, env, func(ctx context.Context, tx Tx) error {
		v, err := env.Keyed.Admit(ctx, tx, "inbox", "m", tok(0, 1), 1)
		if err != nil {
			return err
		}
		if v != fence.Admitted {
			return fmt.Errorf("after a rollback: verdict %s, want admitted", v)
		}
		return env.Write(ctx, tx, "keyed/effect", "v")
	})
	if err != nil {
		t.Fatal(err)
	}
	wantValue(t, env, "keyed/effect", "v")
	if v := s.admit(t, env, "inbox", "m", tok(0, 1), 1); v != fence.Duplicate {
		t.Fatalf("after the commit: %s, want duplicate", v)
	}
}

func (s suite[Tx]) keyedConcurrent(t *testing.T) {
	env := s.needKeyed(t)
	ctx := deadline(t)
	const n = 8
	verdicts := make([]fence.Verdict, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			errs[i] = s.inTx(ctx, env, func(ctx context.Context, tx Tx) (err error) {
				verdicts[i], err = env.Keyed.Admit(ctx, tx, "inbox", "same", tok(0, 3), 42)
				return err
			})
		})
	}
	close(start)
	wg.Wait()
	admitted := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("Admit %d: %v", i, errs[i])
		}
		switch verdicts[i] {
		case fence.Admitted:
			admitted++
		case fence.Duplicate:
		default:
			t.Fatalf("Admit %d = %s", i, verdicts[i])
		}
	}
	if admitted != 1 {
		t.Fatalf("%d of %d concurrent admits of one message were admitted, want exactly 1", admitted, n)
	}
}

// invalidKeys are keys every method must refuse with ErrInvalid.
func invalidKeys() map[string]fence.Key {
	long := strings.Repeat("g", fencecheck.MaxIdentifierLen+1)
	return map[string]fence.Key{
		"empty group":        {Group: "", Topic: "t", Partition: 0},
		"empty topic":        {Group: "g", Topic: "", Partition: 0},
		"negative partition": {Group: "g", Topic: "t", Partition: -1},
		"NUL in group":       {Group: "g\x00x", Topic: "t", Partition: 0},
		"NUL in topic":       {Group: "g", Topic: "t\x00", Partition: 0},
		"invalid UTF-8":      {Group: "g\xff", Topic: "t", Partition: 0},
		"long group":         {Group: long, Topic: "t", Partition: 0},
	}
}

func (s suite[Tx]) badInput(t *testing.T) {
	env := s.open(t)
	ctx := deadline(t)
	for name, k := range invalidKeys() {
		_, err := env.Sink.Claim(ctx, k, tok(0, 1), owner)
		wantIs(t, "Claim with "+name, err, fence.ErrInvalid)
		_, err = env.Sink.Load(ctx, k)
		wantIs(t, "Load with "+name, err, fence.ErrInvalid)
		wantIs(t, "Apply with "+name, apply(t, env, k, tok(0, 1), 0, "bad/key", "v"), fence.ErrInvalid)
		_, err = env.Sink.Recover(ctx, k, tok(0, 0), 1, owner, "test")
		wantIs(t, "Recover with "+name, err, fence.ErrInvalid)
		_, err = env.Sink.Recoveries(ctx, k)
		wantIs(t, "Recoveries with "+name, err, fence.ErrInvalid)
		if env.Begin != nil {
			tx, _, rollback := begin(t, env, ctx)
			wantIs(t, "Advance with "+name, env.Sink.Advance(ctx, tx, k, tok(0, 1), 0, 0), fence.ErrInvalid)
			_ = rollback()
		}
	}
	wantAbsent(t, env, "bad/key")

	k := key("bad")
	for _, bad := range []fence.Token{tok(-1, 0), tok(0, -1), tok(-1, -1)} {
		_, err := env.Sink.Claim(ctx, k, bad, owner)
		wantIs(t, fmt.Sprintf("Claim(%s)", bad), err, fence.ErrInvalid)
		wantIs(t, fmt.Sprintf("Apply(%s)", bad), apply(t, env, k, bad, 0, "bad/token", "v"), fence.ErrInvalid)
		_, err = env.Sink.Recover(ctx, k, bad, 1, owner, "test")
		wantIs(t, fmt.Sprintf("Recover(expected %s)", bad), err, fence.ErrInvalid)
	}
	wantIs(t, "Apply at a negative position", apply(t, env, k, tok(0, 1), -1, "bad/pos", "v"), fence.ErrInvalid)
	wantIs(t, "Apply at NoPosition", apply(t, env, k, tok(0, 1), fence.NoPosition-1, "bad/pos", "v"), fence.ErrInvalid)
	_, err := env.Sink.Recover(ctx, k, tok(0, 0), -1, owner, "test")
	wantIs(t, "Recover to a negative epoch", err, fence.ErrInvalid)
	_, err = env.Sink.Recover(ctx, k, tok(0, 0), 1, owner, "")
	wantIs(t, "Recover without a reason", err, fence.ErrInvalid)
	wantAbsent(t, env, "bad/token")
	wantAbsent(t, env, "bad/pos")
	wantState(t, env, k, fence.State{Position: fence.NoPosition})
	if recs, err := env.Sink.Recoveries(ctx, k); err != nil || len(recs) != 0 {
		t.Fatalf("Recoveries after bad input = %+v, %v", recs, err)
	}
	// Valid extremes are accepted.
	maxKey := fence.Key{Group: strings.Repeat("g", fencecheck.MaxIdentifierLen), Topic: "tópico ✓", Partition: 1<<31 - 1}
	claim(t, env, maxKey, tok(0, 1<<62))
	mustApply(t, env, maxKey, tok(0, 1<<62), 1<<62)
	wantState(t, env, maxKey, fence.State{Token: tok(0, 1<<62), Position: 1 << 62, Claimant: owner})
}

func (s suite[Tx]) keyedBadInput(t *testing.T) {
	env := s.needKeyed(t)
	ctx := deadline(t)
	cases := []struct {
		name, scope, id string
		tk              fence.Token
		seq             int64
	}{
		{"empty scope", "", "id", tok(0, 1), 0},
		{"empty id", "s", "", tok(0, 1), 0},
		{"NUL in scope", "s\x00", "id", tok(0, 1), 0},
		{"NUL in id", "s", "i\x00d", tok(0, 1), 0},
		{"long id", "s", strings.Repeat("i", fencecheck.MaxIdentifierLen+1), tok(0, 1), 0},
		{"negative era", "s", "id", tok(-1, 1), 0},
		{"negative epoch", "s", "id", tok(0, -1), 0},
		{"negative sequence", "s", "id", tok(0, 1), -1},
	}
	for _, c := range cases {
		err := s.inTx(ctx, env, func(ctx context.Context, tx Tx) error {
			v, err := env.Keyed.Admit(ctx, tx, c.scope, c.id, c.tk, c.seq)
			if err == nil {
				return fmt.Errorf("accepted with verdict %s", v)
			}
			return err
		})
		wantIs(t, "Admit with "+c.name, err, fence.ErrInvalid)
	}
	// Nothing was stored for ("s", "id"): the lowest valid message is new.
	if v := s.admit(t, env, "s", "id", fence.Token{}, 0); v != fence.Admitted {
		t.Fatalf("Admit after bad input = %s, want admitted", v)
	}
}

func (s suite[Tx]) tableNames(t *testing.T) {
	env := s.open(t)
	if env.Table == nil {
		t.Skip("Env.Table is nil: the store has no table names")
	}
	for _, name := range []string{
		`x"; DROP TABLE y; --`,
		"",
		"a b",
		"fences;",
		"fen\x00ces",
		strings.Repeat("a", 64),
	} {
		if err := env.Table(name); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("table name %q: error = %v, want ErrInvalid", name, err)
		}
	}
	if err := env.Table("baton_fences_x"); err != nil {
		t.Errorf("table name baton_fences_x: %v", err)
	}
}
