package lease_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/lease"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/internal/memfence"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeSource issues tokens from a counter it can be told to rewind (a restored snapshot).
// It enforces no exclusion: the tests play the service's part by expiring holders themselves.
type fakeSource struct {
	mu       sync.Mutex
	next     int64
	released []string
	lost     map[string]func(error)
}

func (f *fakeSource) Acquire(_ context.Context, resource string) (*lease.Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	id := resource + "#" + time.Duration(f.next).String()
	l, lost, err := lease.Grant(lease.Key("lease:fake", resource), fence.Token{Epoch: f.next}, id, func(context.Context) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.released = append(f.released, id)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if f.lost == nil {
		f.lost = map[string]func(error){}
	}
	f.lost[id] = lost
	return l, nil
}

func (f *fakeSource) expire(l *lease.Lease, cause error) {
	f.mu.Lock()
	lost := f.lost[l.ID()]
	f.mu.Unlock()
	lost(cause)
}

func (f *fakeSource) rewind(to int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next = to
}

var _ lease.Source = (*fakeSource)(nil)

// sinkEnv is one fenced sink plus a way to write and read the caller's value in it.
type sinkEnv[Tx any] struct {
	sink  fence.Sink[Tx]
	write func(ctx context.Context, tx Tx, v string) error
	read  func(t *testing.T) string
}

func memEnv(t *testing.T) sinkEnv[*memfence.Tx] {
	s, err := memfence.New()
	if err != nil {
		t.Fatal(err)
	}
	return sinkEnv[*memfence.Tx]{
		sink:  s,
		write: func(_ context.Context, tx *memfence.Tx, v string) error { return tx.Put("v", []byte(v)) },
		read: func(*testing.T) string {
			v, _ := s.Get("v")
			return string(v)
		},
	}
}

func sqliteEnv(t *testing.T) sinkEnv[*sql.Tx] {
	s, err := sqlitefence.Open(filepath.Join(t.TempDir(), "lease.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if _, err := s.DB().Exec(`CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return sinkEnv[*sql.Tx]{
		sink: s,
		write: func(ctx context.Context, tx *sql.Tx, v string) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO kv (k, v) VALUES ('v', ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v`, v)
			return err
		},
		read: func(t *testing.T) string {
			var v string
			if err := s.DB().QueryRow(`SELECT v FROM kv WHERE k = 'v'`).Scan(&v); err != nil && !errors.Is(err, sql.ErrNoRows) {
				t.Fatal(err)
			}
			return v
		},
	}
}

func TestGrantRejectsAllProblems(t *testing.T) {
	_, _, err := lease.Grant(fence.Key{Partition: -1}, fence.Token{}, "", nil)
	if !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("Grant(bad) = %v, want ErrInvalid", err)
	}
	for _, want := range []string{"empty group", "zero token", "nil release"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Grant error %q does not mention %q", err, want)
		}
	}
}

func TestKey(t *testing.T) {
	if got, want := lease.Key("lease:etcd", "nightly"), (fence.Key{Group: "lease:etcd", Topic: "nightly"}); got != want {
		t.Fatalf("Key = %v, want %v", got, want)
	}
}

func TestReleaseEndsContextOnce(t *testing.T) {
	src := &fakeSource{}
	ctx := context.Background()
	l, err := src.Acquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if context.Cause(l.Context()) != nil {
		t.Fatalf("fresh lease cause = %v", context.Cause(l.Context()))
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	_ = l.Release(ctx)
	<-l.Context().Done()
	if !errors.Is(context.Cause(l.Context()), lease.ErrReleased) {
		t.Fatalf("after Release: cause = %v", context.Cause(l.Context()))
	}
	if len(src.released) != 1 {
		t.Fatalf("release ran %d times, want 1", len(src.released))
	}
	src.expire(l, errors.New("late")) // a loss reported after Release changes nothing
	if errors.Is(context.Cause(l.Context()), lease.ErrLost) {
		t.Fatalf("Err after late loss = %v, want still ErrReleased", context.Cause(l.Context()))
	}
}

func TestSinks(t *testing.T) {
	t.Run("memfence", func(t *testing.T) { runSinkCases(t, func(t *testing.T) sinkEnv[*memfence.Tx] { return memEnv(t) }) })
	t.Run("sqlitefence", func(t *testing.T) { runSinkCases(t, func(t *testing.T) sinkEnv[*sql.Tx] { return sqliteEnv(t) }) })
}

func runSinkCases[Tx any](t *testing.T, open func(t *testing.T) sinkEnv[Tx]) {
	t.Run("ZombieRefused", func(t *testing.T) { zombieRefused(t, open(t)) })
	t.Run("LostDuringApply", func(t *testing.T) { lostDuringApply(t, open(t)) })
	t.Run("LostBeforeApply", func(t *testing.T) { lostBeforeApply(t, open(t)) })
	t.Run("TokenRegression", func(t *testing.T) { tokenRegression(t, open(t)) })
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mustWrite[Tx any](t *testing.T, e sinkEnv[Tx], l *lease.Lease, pos int64, v string) {
	t.Helper()
	if err := lease.Apply(ctxT(t), e.sink, l, pos, func(ctx context.Context, tx Tx) error { return e.write(ctx, tx, v) }); err != nil {
		t.Fatalf("write %q at %d under %s: %v", v, pos, l.Token(), err)
	}
}

func mustClaim[Tx any](t *testing.T, e sinkEnv[Tx], l *lease.Lease) fence.State {
	t.Helper()
	st, err := lease.Claim(ctxT(t), e.sink, l)
	if err != nil {
		t.Fatalf("claim under %s: %v", l.Token(), err)
	}
	return st
}

// zombieRefused: A is expired without knowing it (paused), B acquires, claims and writes; A's
// write under its old token is refused by the sink, whose value stays B's.
func zombieRefused[Tx any](t *testing.T, e sinkEnv[Tx]) {
	src := &fakeSource{}
	ctx := ctxT(t)
	a, _ := src.Acquire(ctx, "job")
	defer a.Release(ctx)
	mustClaim(t, e, a)
	mustWrite(t, e, a, 1, "a1")

	b, _ := src.Acquire(ctx, "job") // the service gave the resource away; A was not told
	defer b.Release(ctx)
	if st := mustClaim(t, e, b); st.Position != 1 {
		t.Fatalf("B resumes at %d, want 1", st.Position)
	}
	mustWrite(t, e, b, 2, "b2")

	if context.Cause(a.Context()) != nil {
		t.Fatalf("A must not know yet: %v", context.Cause(a.Context()))
	}
	ran := false
	err := lease.Apply(ctx, e.sink, a, 3, func(ctx context.Context, tx Tx) error { ran = true; return e.write(ctx, tx, "a3") })
	var stale *fence.StaleError
	if !errors.As(err, &stale) || stale.Stored != b.Token() || stale.Presented != a.Token() {
		t.Fatalf("zombie write = %v, want *fence.StaleError stored %s presented %s", err, b.Token(), a.Token())
	}
	if ran {
		t.Fatal("the zombie's write function ran")
	}
	if got := e.read(t); got != "b2" {
		t.Fatalf("value = %q, want b2", got)
	}
}

// lostDuringApply: the lease is lost while fn runs; the write fails with ErrLost and does not
// commit, even though no successor has claimed yet (the context stopped it).
func lostDuringApply[Tx any](t *testing.T, e sinkEnv[Tx]) {
	src := &fakeSource{}
	ctx := ctxT(t)
	a, _ := src.Acquire(ctx, "job")
	defer a.Release(ctx)
	mustClaim(t, e, a)
	mustWrite(t, e, a, 1, "a1")
	cause := errors.New("session expired")
	err := lease.Apply(ctx, e.sink, a, 2, func(ctx context.Context, tx Tx) error {
		if err := e.write(ctx, tx, "a2"); err != nil {
			return err
		}
		src.expire(a, cause) // the loss arrives mid-write
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
			t.Error("fn's context did not end when the lease was lost")
		}
		return nil // a careless fn that ignores ctx: the commit must still not happen
	})
	if !errors.Is(err, lease.ErrLost) || !errors.Is(err, cause) {
		t.Fatalf("Apply = %v, want ErrLost wrapping the cause", err)
	}
	if got := e.read(t); got != "a1" {
		t.Fatalf("value = %q, want a1 (the in-flight write must not commit)", got)
	}
	st, err := e.sink.Load(ctx, a.Key())
	if err != nil || st.Position != 1 {
		t.Fatalf("fence = %+v, %v; want position 1", st, err)
	}
}

// lostBeforeApply: a holder that already knows it lost the lease is stopped before writing,
// and Claim refuses too.
func lostBeforeApply[Tx any](t *testing.T, e sinkEnv[Tx]) {
	src := &fakeSource{}
	ctx := ctxT(t)
	a, _ := src.Acquire(ctx, "job")
	defer a.Release(ctx)
	src.expire(a, nil)
	if _, err := lease.Claim(ctx, e.sink, a); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("Claim after loss = %v, want ErrLost", err)
	}
	err := lease.Apply(ctx, e.sink, a, 1, func(ctx context.Context, tx Tx) error { return e.write(ctx, tx, "a1") })
	if !errors.Is(err, lease.ErrLost) {
		t.Fatalf("Apply after loss = %v, want ErrLost", err)
	}
	if got := e.read(t); got != "" {
		t.Fatalf("value = %q, want nothing written", got)
	}
}

// tokenRegression: the source's tokens go backwards (an etcd restored from an old snapshot, a
// promoted replica without the last counter increments). The rightful new holder presents a
// token lower than the stored one; the sink refuses it as stale and never accepts it silently.
// Only an explicit, recorded Recover moves the fence to a new era.
func tokenRegression[Tx any](t *testing.T, e sinkEnv[Tx]) {
	src := &fakeSource{}
	ctx := ctxT(t)
	for range 5 { // tokens 1..5 were issued and the last one wrote
		l, _ := src.Acquire(ctx, "job")
		mustClaim(t, e, l)
		_ = l.Release(ctx)
	}
	a, _ := src.Acquire(ctx, "job") // token 6
	defer a.Release(ctx)
	mustClaim(t, e, a)
	mustWrite(t, e, a, 1, "a1") // then A is paused; it never learns that the history was rewound

	src.rewind(2) // restored from a snapshot taken when the counter stood at 2
	b, _ := src.Acquire(ctx, "job")
	defer b.Release(ctx)
	if b.Token().Epoch != 3 {
		t.Fatalf("B's token %s, want epoch 3", b.Token())
	}
	_, err := lease.Claim(ctx, e.sink, b)
	var stale *fence.StaleError
	if !errors.As(err, &stale) || stale.Stored != a.Token() {
		t.Fatalf("Claim with a regressed token = %v, want *fence.StaleError stored %s", err, a.Token())
	}
	err = lease.Apply(ctx, e.sink, b, 2, func(ctx context.Context, tx Tx) error { return e.write(ctx, tx, "b2") })
	if !errors.As(err, &stale) {
		t.Fatalf("Apply with a regressed token = %v, want *fence.StaleError", err)
	}
	if got := e.read(t); got != "a1" {
		t.Fatalf("value = %q, want a1", got)
	}
	// The operator proves B is the current holder and recovers: the fence moves to era 1.
	to, err := e.sink.Recover(ctx, b.Key(), a.Token(), b.Token().Epoch, "operator", "etcd restored from snapshot")
	if err != nil || to != (fence.Token{Era: 1, Epoch: 3}) {
		t.Fatalf("Recover = %s, %v", to, err)
	}
	// The zombie of the old history (token 0.6) is now refused too.
	err = lease.Apply(ctx, e.sink, a, 2, func(ctx context.Context, tx Tx) error { return e.write(ctx, tx, "a2") })
	if !errors.Is(err, fence.ErrStale) {
		t.Fatalf("old-history write after recovery = %v, want stale", err)
	}
}
