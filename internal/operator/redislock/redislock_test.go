package redislock_test

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/operator/redislock"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// TestLeaseSemantics proves the baseline lock behaves like the seeds' naive lock on a real Redis:
// exclusive while held, released only by its holder, and lost silently when the lease expires
// (the holder is not told; that is the flaw the chaos harness demonstrates).
func TestLeaseSemantics(t *testing.T) {
	addr := os.Getenv("BATON_REDIS_ADDR")
	if addr == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("BATON_REDIS_ADDR is not set: CI must provide Redis (make test starts it)")
		}
		t.Skip("BATON_REDIS_ADDR is not set: run 'make up' and export what 'make env' prints")
	}
	ctx := testenv.Context(t, 10*time.Second)
	c, err := redislock.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	key := testenv.UniqueName("lock")

	ok, err := c.TryAcquire(ctx, key, "a", 300*time.Millisecond)
	if err != nil || !ok {
		t.Fatalf("first acquire: %v %v", ok, err)
	}
	if ok, err := c.TryAcquire(ctx, key, "b", time.Second); err != nil || ok {
		t.Fatalf("second acquire while held: %v %v, want false", ok, err)
	}
	if err := c.Release(ctx, key, "b"); !errors.Is(err, redislock.ErrNotHeld) {
		t.Fatalf("release by non-holder: %v, want ErrNotHeld", err)
	}
	if err := c.Extend(ctx, key, "a", 300*time.Millisecond); err != nil {
		t.Fatalf("extend by holder: %v", err)
	}
	// The lease runs out with nobody telling the holder.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, held, err := c.Get(ctx, key); err != nil {
			t.Fatal(err)
		} else if !held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("lease never expired")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if ok, err := c.TryAcquire(ctx, key, "b", time.Second); err != nil || !ok {
		t.Fatalf("acquire after expiry: %v %v", ok, err)
	}
	if err := c.Release(ctx, key, "a"); !errors.Is(err, redislock.ErrNotHeld) {
		t.Fatalf("the expired holder released someone else's lock: %v", err)
	}
	if v, _, _ := c.Get(ctx, key); v != "b" {
		t.Fatalf("lock value %q, want b", v)
	}
}
