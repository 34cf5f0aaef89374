package fencetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/batonhq/baton/fence"
)

// OCCEnv is one fresh versioned table under test (a [fence.Versioned]), with the hooks the OCC
// suite needs.
type OCCEnv[Tx any] struct {
	// Versioned is the store's optimistic writer over a fresh, empty table whose key column
	// holds text, with the version column and a text column named "value", the only column
	// the suite sets.
	Versioned fence.Versioned[Tx]
	// Table, Key and Version are the names Versioned was built with: the conflict errors must
	// report Table, and the bad-input case tries to set Key and Version.
	Table, Key, Version string
	// Begin starts a transaction and returns functions that commit or roll it back. Rollback
	// after commit must be harmless and must not depend on ctx (the suite rolls back every
	// transaction still open in t.Cleanup).
	Begin func(ctx context.Context) (tx Tx, commit func() error, rollback func() error, err error)
	// Read returns the committed value and version of record id, outside any transaction;
	// ok is false if there is no such record.
	Read func(ctx context.Context, id string) (value string, version int64, ok bool, err error)
	// Names builds the store's writer with the given table, key and version column names and
	// returns the constructor's error. Nil skips OCCNames.
	Names func(table, key, version string) error
}

// occWriters is how many writers the concurrent cases start at once.
const occWriters = 8

// RunOCC runs the optimistic-concurrency conformance suite: a single-record conditional write
// whose version is compared and incremented in one statement. open is called once per case and
// must return a fresh, empty table (its own schema or file) that it cleans up when t ends.
// Cases run in parallel, each call under a 10-second deadline.
//
// What the cases hold a store to, beyond the doc of [fence.Versioned]:
//
//   - A refusal is a *[fence.VersionConflictError] carrying the table, the id, the expected
//     version and the stored one, and it writes nothing: neither the columns nor the version.
//   - Of eight concurrent writers that read the same version, exactly one succeeds (for
//     updates and for creates): the compare and the increment are one atomic step.
//   - The write belongs to the caller's transaction: a rollback discards it, a refusal leaves
//     the transaction usable for the caller's other writes, and a later write in the same
//     transaction sees it.
//   - Bad arguments and hostile names fail with [fence.ErrInvalid] and write nothing.
func RunOCC[Tx any](t *testing.T, open func(t *testing.T) OCCEnv[Tx]) {
	t.Helper()
	s := occSuite[Tx]{open: open}
	cases := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"OCCCreateThenUpdate", s.createThenUpdate},
		{"OCCCreateExisting", s.createExisting},
		{"OCCStaleVersionRefused", s.staleRefused},
		{"OCCMissingRecord", s.missingRecord},
		{"OCCPausedWriter", s.pausedWriter},
		{"OCCConcurrentUpdatesOneWins", s.concurrentUpdates},
		{"OCCConcurrentCreatesOneWins", s.concurrentCreates},
		{"OCCRecordIsolation", s.isolation},
		{"OCCCallerTransaction", s.callerTx},
		{"OCCBadInput", s.badInput},
		{"OCCNames", s.names},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t)
		})
	}
}

type occSuite[Tx any] struct {
	open func(t *testing.T) OCCEnv[Tx]
}

func val(v string) fence.Column { return fence.Column{Name: "value", Value: v} }

// occBegin starts a transaction that t.Cleanup rolls back if the case left it open.
func occBegin[Tx any](t *testing.T, env OCCEnv[Tx], ctx context.Context) (Tx, func() error, func() error) {
	t.Helper()
	tx, commit, rollback, err := env.Begin(ctx)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	t.Cleanup(func() { _ = rollback() })
	return tx, commit, rollback
}

// occWrite runs one Write in its own transaction and commits it if it succeeded.
func occWrite[Tx any](t *testing.T, env OCCEnv[Tx], id string, expected int64, set ...fence.Column) (int64, error) {
	t.Helper()
	ctx := deadline(t)
	tx, commit, rollback := occBegin(t, env, ctx)
	v, err := env.Versioned.Write(ctx, tx, id, expected, set...)
	if err != nil {
		if rerr := rollback(); rerr != nil {
			t.Fatalf("rollback: %v", rerr)
		}
		return v, err
	}
	if err := commit(); err != nil {
		t.Fatalf("commit after Write(%q, %d): %v", id, expected, err)
	}
	return v, nil
}

func mustOCCWrite[Tx any](t *testing.T, env OCCEnv[Tx], id string, expected int64, value string) int64 {
	t.Helper()
	v, err := occWrite(t, env, id, expected, val(value))
	if err != nil {
		t.Fatalf("Write(%q, expected %d, %q): %v", id, expected, value, err)
	}
	if v != expected+1 {
		t.Fatalf("Write(%q, expected %d) returned version %d, want %d", id, expected, v, expected+1)
	}
	return v
}

// wantRecord checks the committed value and version of id.
func wantRecord[Tx any](t *testing.T, env OCCEnv[Tx], id, value string, version int64) {
	t.Helper()
	v, ver, ok, err := env.Read(deadline(t), id)
	if err != nil {
		t.Fatalf("Read(%q): %v", id, err)
	}
	if !ok || v != value || ver != version {
		t.Fatalf("Read(%q) = %q at version %d (exists %v); want %q at version %d", id, v, ver, ok, value, version)
	}
}

func wantNoRecord[Tx any](t *testing.T, env OCCEnv[Tx], id string) {
	t.Helper()
	v, ver, ok, err := env.Read(deadline(t), id)
	if err != nil {
		t.Fatalf("Read(%q): %v", id, err)
	}
	if ok {
		t.Fatalf("Read(%q) = %q at version %d: the record must not exist", id, v, ver)
	}
}

// wantConflict checks that err is a *VersionConflictError for (table, id) with the versions.
func wantConflict[Tx any](t *testing.T, env OCCEnv[Tx], err error, id string, expected, found int64) {
	t.Helper()
	var ce *fence.VersionConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("error %v is not a *fence.VersionConflictError (expected %d, found %d)", err, expected, found)
	}
	if ce.Table != env.Table || fmt.Sprint(ce.ID) != id || ce.Expected != expected || ce.Found != found {
		t.Fatalf("VersionConflictError = {Table %q, ID %v, Expected %d, Found %d}, want {%q, %s, %d, %d}",
			ce.Table, ce.ID, ce.Expected, ce.Found, env.Table, id, expected, found)
	}
}

// createThenUpdate: a create starts at version 1, each update raises it by one and returns it.
func (s occSuite[Tx]) createThenUpdate(t *testing.T) {
	env := s.open(t)
	wantNoRecord(t, env, "r")
	mustOCCWrite(t, env, "r", 0, "a")
	wantRecord(t, env, "r", "a", 1)
	for i, v := range []string{"b", "c", "d"} {
		mustOCCWrite(t, env, "r", int64(i+1), v)
		wantRecord(t, env, "r", v, int64(i+2))
	}
}

// createExisting: a create of a record that exists is a conflict, not an overwrite.
func (s occSuite[Tx]) createExisting(t *testing.T) {
	env := s.open(t)
	mustOCCWrite(t, env, "r", 0, "first")
	mustOCCWrite(t, env, "r", 1, "second")
	_, err := occWrite(t, env, "r", 0, val("again"))
	wantConflict(t, env, err, "r", 0, 2)
	wantRecord(t, env, "r", "second", 2)
}

// staleRefused: a version lower or higher than the stored one is refused, and nothing moves.
func (s occSuite[Tx]) staleRefused(t *testing.T) {
	env := s.open(t)
	mustOCCWrite(t, env, "r", 0, "v1")
	mustOCCWrite(t, env, "r", 1, "v2")
	_, err := occWrite(t, env, "r", 1, val("stale"))
	wantConflict(t, env, err, "r", 1, 2)
	wantRecord(t, env, "r", "v2", 2)
	_, err = occWrite(t, env, "r", 7, val("future"))
	wantConflict(t, env, err, "r", 7, 2)
	wantRecord(t, env, "r", "v2", 2)
	mustOCCWrite(t, env, "r", 2, "v3") // the refusals consumed nothing
	wantRecord(t, env, "r", "v3", 3)
}

// missingRecord: an update of a record that does not exist is a conflict and creates nothing.
func (s occSuite[Tx]) missingRecord(t *testing.T) {
	env := s.open(t)
	_, err := occWrite(t, env, "ghost", 3, val("x"))
	wantConflict(t, env, err, "ghost", 3, 0)
	wantNoRecord(t, env, "ghost")
}

// pausedWriter is the seeds' scenario: A reads version 1, is paused; B reads version 1 and
// writes; A wakes and writes with the version it read, and is refused; B's write stands.
func (s occSuite[Tx]) pausedWriter(t *testing.T) {
	env := s.open(t)
	mustOCCWrite(t, env, "order-4711", 0, "CREATED")
	_, versionA, _, err := env.Read(deadline(t), "order-4711")
	if err != nil {
		t.Fatal(err)
	}
	// A pauses here. B reads the same version and writes.
	_, versionB, _, err := env.Read(deadline(t), "order-4711")
	if err != nil {
		t.Fatal(err)
	}
	mustOCCWrite(t, env, "order-4711", versionB, "RELEASED-by-B")
	// A wakes up.
	_, err = occWrite(t, env, "order-4711", versionA, val("RELEASED-by-A"))
	wantConflict(t, env, err, "order-4711", versionA, versionA+1)
	wantRecord(t, env, "order-4711", "RELEASED-by-B", 2)
}

// race starts occWriters writers of id at once, each in its own transaction with the same
// expected version, and returns the index of the one that succeeded. Every other must be
// refused with a conflict naming expected and expected+1.
func (s occSuite[Tx]) race(t *testing.T, env OCCEnv[Tx], id string, expected int64) int {
	t.Helper()
	ctx := deadline(t)
	start := make(chan struct{})
	errs := make([]error, occWriters)
	versions := make([]int64, occWriters)
	var wg sync.WaitGroup
	for i := range occWriters {
		wg.Go(func() {
			<-start
			tx, commit, rollback, err := env.Begin(ctx)
			if err != nil {
				errs[i] = fmt.Errorf("begin: %w", err)
				return
			}
			defer func() { _ = rollback() }()
			v, err := env.Versioned.Write(ctx, tx, id, expected, val(fmt.Sprintf("writer-%d", i)))
			if err != nil {
				errs[i] = err
				return
			}
			versions[i] = v
			errs[i] = commit()
		})
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner >= 0:
			t.Fatalf("writers %d and %d both wrote %q over version %d: a lost update", winner, i, id, expected)
		case err == nil:
			if versions[i] != expected+1 {
				t.Fatalf("winner %d got version %d, want %d", i, versions[i], expected+1)
			}
			winner = i
		default:
			wantConflict(t, env, err, id, expected, expected+1)
		}
	}
	if winner < 0 {
		t.Fatalf("none of %d writers wrote %q over version %d", occWriters, id, expected)
	}
	wantRecord(t, env, id, fmt.Sprintf("writer-%d", winner), expected+1)
	return winner
}

// concurrentUpdates: of writers that read the same version, exactly one wins.
func (s occSuite[Tx]) concurrentUpdates(t *testing.T) {
	env := s.open(t)
	mustOCCWrite(t, env, "hot", 0, "start")
	mustOCCWrite(t, env, "hot", 1, "start")
	s.race(t, env, "hot", 2)
	s.race(t, env, "hot", 3) // and again, on the version the winner wrote
}

// concurrentCreates: of writers that create the same record, exactly one wins.
func (s occSuite[Tx]) concurrentCreates(t *testing.T) {
	env := s.open(t)
	s.race(t, env, "new", 0)
}

// isolation: records do not share versions.
func (s occSuite[Tx]) isolation(t *testing.T) {
	env := s.open(t)
	mustOCCWrite(t, env, "a", 0, "a1")
	mustOCCWrite(t, env, "b", 0, "b1")
	mustOCCWrite(t, env, "a", 1, "a2")
	mustOCCWrite(t, env, "a", 2, "a3")
	wantRecord(t, env, "b", "b1", 1)
	_, err := occWrite(t, env, "b", 3, val("b?"))
	wantConflict(t, env, err, "b", 3, 1)
	mustOCCWrite(t, env, "b", 1, "b2")
	wantRecord(t, env, "a", "a3", 3)
	wantRecord(t, env, "b", "b2", 2)
}

// callerTx: the write is part of the caller's transaction.
func (s occSuite[Tx]) callerTx(t *testing.T) {
	env := s.open(t)
	mustOCCWrite(t, env, "r", 0, "committed")

	// A rollback discards the write, and the version it would have taken stays free.
	ctx := deadline(t)
	tx, _, rollback := occBegin(t, env, ctx)
	if v, err := env.Versioned.Write(ctx, tx, "r", 1, val("rolled back")); err != nil || v != 2 {
		t.Fatalf("Write in tx = %d, %v; want 2, nil", v, err)
	}
	if v, err := env.Versioned.Write(ctx, tx, "other", 0, val("rolled back")); err != nil || v != 1 {
		t.Fatalf("create in tx = %d, %v; want 1, nil", v, err)
	}
	if err := rollback(); err != nil {
		t.Fatal(err)
	}
	wantRecord(t, env, "r", "committed", 1)
	wantNoRecord(t, env, "other")

	// In one transaction: a refusal leaves it usable, a later write sees an earlier one, and
	// the commit makes them visible together.
	tx, commit, _ := occBegin(t, env, ctx)
	_, err := env.Versioned.Write(ctx, tx, "r", 5, val("refused"))
	wantConflict(t, env, err, "r", 5, 1)
	if v, err := env.Versioned.Write(ctx, tx, "r", 1, val("step 1")); err != nil || v != 2 {
		t.Fatalf("Write after a refusal in the same tx = %d, %v; want 2, nil", v, err)
	}
	if v, err := env.Versioned.Write(ctx, tx, "r", 2, val("step 2")); err != nil || v != 3 {
		t.Fatalf("second Write in the same tx = %d, %v; want 3, nil (a write must see its own transaction's)", v, err)
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	wantRecord(t, env, "r", "step 2", 3)
}

// badInput: every bad argument fails with ErrInvalid and writes nothing.
func (s occSuite[Tx]) badInput(t *testing.T) {
	env := s.open(t)
	mustOCCWrite(t, env, "r", 0, "kept")
	bad := []struct {
		name     string
		id       any
		expected int64
		set      []fence.Column
	}{
		{"negative expected version", "r", -1, []fence.Column{val("x")}},
		{"no columns", "r", 1, nil},
		{"the key column", "r", 1, []fence.Column{val("x"), {Name: env.Key, Value: "other"}}},
		{"the version column", "r", 1, []fence.Column{val("x"), {Name: env.Version, Value: int64(99)}}},
		{"a column twice", "r", 1, []fence.Column{val("x"), val("y")}},
		{"an injection-shaped column", "r", 1, []fence.Column{{Name: `value" = 'x', "version" = 99 --`, Value: "x"}}},
		{"a qualified column", "r", 1, []fence.Column{{Name: "t.value", Value: "x"}}},
		{"an empty column name", "r", 1, []fence.Column{{Name: "", Value: "x"}}},
		{"a nil id", nil, 1, []fence.Column{val("x")}},
		{"a create with no columns", "new", 0, nil},
	}
	for _, b := range bad {
		ctx := deadline(t)
		tx, commit, rollback := occBegin(t, env, ctx)
		_, err := env.Versioned.Write(ctx, tx, b.id, b.expected, b.set...)
		if !errors.Is(err, fence.ErrInvalid) {
			_ = commit()
			t.Fatalf("%s: Write = %v, want ErrInvalid", b.name, err)
		}
		if err := rollback(); err != nil {
			t.Fatal(err)
		}
	}
	wantRecord(t, env, "r", "kept", 1)
	wantNoRecord(t, env, "new")
}

// names: valid names are accepted; hostile, over-long or clashing ones fail with ErrInvalid.
func (s occSuite[Tx]) names(t *testing.T) {
	env := s.open(t)
	if env.Names == nil {
		t.Skip("the store has no configurable names")
	}
	for _, n := range [][3]string{
		{"work_order", "id", "version"},
		{"Orders", "OrderID", "Rev"},
		{"s.t", "k", "v"},
		{strings.Repeat("t", 63), strings.Repeat("k", 63), strings.Repeat("v", 63)},
	} {
		if err := env.Names(n[0], n[1], n[2]); err != nil {
			t.Errorf("Names(%q, %q, %q) = %v, want nil", n[0], n[1], n[2], err)
		}
	}
	for _, n := range [][3]string{
		{"", "id", "version"},
		{`t"; DROP TABLE x; --`, "id", "version"},
		{"t", `id" = "id`, "version"},
		{"t", "id", "version = 0 --"},
		{"t", "s.id", "version"},
		{"t", "id", "id"},
		{"a.b.c", "id", "version"},
		{strings.Repeat("t", 64), "id", "version"},
		{"t", strings.Repeat("k", 64), "version"},
		{"t", "", "version"},
		{"t", "id", ""},
	} {
		if err := env.Names(n[0], n[1], n[2]); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("Names(%q, %q, %q) = %v, want ErrInvalid", n[0], n[1], n[2], err)
		}
	}
}
