package memfence_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/fencetest"
	"github.com/batonhq/baton/internal/memfence"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var errUserWrite = errors.New("user write failed")

func newEnv(t *testing.T) fencetest.Env[*memfence.Tx] {
	s, err := memfence.New()
	if err != nil {
		t.Fatal(err)
	}
	return fencetest.Env[*memfence.Tx]{
		Sink:  s,
		Keyed: s,
		Write: func(ctx context.Context, tx *memfence.Tx, key, value string) error {
			if value == "fail" {
				return errUserWrite
			}
			return tx.Put(key, []byte(value))
		},
		Read: func(ctx context.Context, key string) (string, bool, error) {
			v, ok := s.Get(key)
			return string(v), ok, nil
		},
		Begin: func(ctx context.Context) (*memfence.Tx, func() error, func() error, error) {
			tx, err := s.Begin(ctx)
			if err != nil {
				return nil, nil, nil, err
			}
			return tx, tx.Commit, tx.Rollback, nil
		},
	}
}

func TestConformance(t *testing.T) { fencetest.Run(t, newEnv) }

// TestConformanceWithoutBegin runs the keyed cases through Apply, the path stores without
// caller-held transactions take.
func TestConformanceWithoutBegin(t *testing.T) {
	fencetest.Run(t, func(t *testing.T) fencetest.Env[*memfence.Tx] {
		env := newEnv(t)
		env.Begin = nil
		return env
	})
}

var k = fence.Key{Group: "g", Topic: "t", Partition: 0}

func TestTxDone(t *testing.T) {
	ctx := t.Context()
	s, _ := memfence.New()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Put("a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if v, ok := tx.Get("a"); !ok || string(v) != "1" {
		t.Fatalf("tx.Get sees %q, %v; want its own write", v, ok)
	}
	if _, ok := s.Get("a"); ok {
		t.Fatal("an uncommitted write is visible")
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"Commit":   tx.Commit(),
		"Rollback": tx.Rollback(),
		"Put":      tx.Put("b", nil),
		"Advance":  s.Advance(ctx, tx, k, fence.Token{}, 0, 0),
	} {
		if !errors.Is(err, memfence.ErrTxDone) {
			t.Errorf("%s after Commit: %v, want ErrTxDone", name, err)
		}
	}
	if _, err := s.Admit(ctx, tx, "s", "i", fence.Token{}, 0); !errors.Is(err, memfence.ErrTxDone) {
		t.Errorf("Admit after Commit: %v, want ErrTxDone", err)
	}
	if v, ok := s.Get("a"); !ok || string(v) != "1" {
		t.Fatalf("Get = %q, %v", v, ok)
	}
}

func TestForeignTx(t *testing.T) {
	ctx := t.Context()
	a, _ := memfence.New()
	b, _ := memfence.New()
	tx, _ := b.Begin(ctx)
	defer func() { _ = tx.Rollback() }()
	if err := a.Advance(ctx, tx, k, fence.Token{}, 0, 0); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("Advance with another store's tx: %v, want ErrInvalid", err)
	}
	if err := a.Advance(ctx, nil, k, fence.Token{}, 0, 0); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("Advance with a nil tx: %v, want ErrInvalid", err)
	}
}

// TestWaitRespectsContext: a claim waiting for a key held by an open transaction gives up
// when its context ends, and the key is usable afterwards.
func TestWaitRespectsContext(t *testing.T) {
	s, _ := memfence.New()
	if _, err := s.Claim(t.Context(), k, fence.Token{Epoch: 1}, "fencetest"); err != nil {
		t.Fatal(err)
	}
	tx, _ := s.Begin(t.Context())
	if err := s.Advance(t.Context(), tx, k, fence.Token{Epoch: 1}, 0, 0); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.Claim(ctx, k, fence.Token{Epoch: 2}, "fencetest"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Claim while the key is held, ctx cancelled: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	st, err := s.Claim(t.Context(), k, fence.Token{Epoch: 2}, "fencetest")
	if err != nil || st.Position != 0 {
		t.Fatalf("Claim after the commit = %+v, %v", st, err)
	}
}

func TestApplyReleasesKeyWhenFnPanics(t *testing.T) {
	s, _ := memfence.New()
	if _, err := s.Claim(t.Context(), k, fence.Token{Epoch: 1}, "fencetest"); err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() { _ = recover() }()
		_ = s.Apply(t.Context(), k, fence.Token{Epoch: 1}, 0, 0, func(ctx context.Context, tx *memfence.Tx) error {
			panic("boom")
		})
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second) // a bound on a hang, not a timing assertion
	defer cancel()
	if err := s.Apply(ctx, k, fence.Token{Epoch: 1}, 0, 0, nil); err != nil {
		t.Fatalf("Apply after a panicking fn: %v", err)
	}
}

func TestClock(t *testing.T) {
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	s, err := memfence.New(memfence.Clock(func() time.Time { return at }))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recover(t.Context(), k, fence.Token{}, 1, "fencetest", "test"); err != nil {
		t.Fatal(err)
	}
	recs, _ := s.Recoveries(t.Context(), k)
	if len(recs) != 1 || !recs[0].At.Equal(at) {
		t.Fatalf("Recoveries = %+v, want one at %s", recs, at)
	}
	if _, err := memfence.New(memfence.Clock(nil)); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("New(Clock(nil)): %v, want ErrInvalid", err)
	}
}

func TestValuesAreCopied(t *testing.T) {
	s, _ := memfence.New()
	b := []byte("abc")
	err := s.Apply(t.Context(), k, fence.Token{}, 0, 0, func(ctx context.Context, tx *memfence.Tx) error {
		return tx.Put("x", b)
	})
	if err != nil {
		t.Fatal(err)
	}
	b[0] = 'z'
	v, _ := s.Get("x")
	v[1] = 'z'
	if v, _ := s.Get("x"); string(v) != "abc" {
		t.Fatalf("stored value changed through an alias: %q", v)
	}
}
