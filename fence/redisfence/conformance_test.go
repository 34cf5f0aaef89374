package redisfence

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/batonhq/baton/fence/fencetest"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// testPrefixes returns a key prefix for the store and one for the user's keys, both unique to
// the test, and removes every key under them when the test ends: the server is shared.
func testPrefixes(t testing.TB, c *redis.Client) (store, user string) {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	store, user = "bt"+id+":", "bu"+id+":"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, p := range []string{store, user} {
			iter := c.Scan(ctx, 0, p+"*", 1000).Iterator()
			for iter.Next(ctx) {
				c.Del(ctx, iter.Val())
			}
			if err := iter.Err(); err != nil {
				t.Logf("removing the test's keys %s*: %v", p, err)
			}
		}
	})
	return store, user
}

// client connects to the Redis at addr and closes the client when the test ends.
func client(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// envFor builds the suite's Env over a store with the given prefix. The user's writes are
// HSETs of field v; a write of "fail" is an HSET on a key that holds a string, which the
// commit refuses (ErrCommand) without writing anything.
func envFor(t testing.TB, c *redis.Client, prefix, user string, opts ...Option) fencetest.Env[*Tx] {
	t.Helper()
	s, err := New(c, append([]Option{Prefix(prefix)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	wrongType := user + "a-string"
	if err := c.Set(context.Background(), wrongType, "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	return fencetest.Env[*Tx]{
		Sink:  s,
		Keyed: s,
		Write: func(ctx context.Context, tx *Tx, key, value string) error {
			if value == "fail" {
				tx.HSet(wrongType, "v", value)
				return nil
			}
			tx.HSet(user+key, "v", value)
			return nil
		},
		Read: func(ctx context.Context, key string) (string, bool, error) {
			v, err := c.HGet(ctx, user+key, "v").Result()
			if errors.Is(err, redis.Nil) {
				return "", false, nil
			}
			return v, err == nil, err
		},
		Reopen: func(t testing.TB) fencetest.Env[*Tx] {
			return envFor(t, client(t, c.Options().Addr), prefix, user, opts...)
		},
		Table: func(name string) error {
			_, err := New(c, Prefix(name))
			return err
		},
		Begin: func(ctx context.Context) (*Tx, func() error, func() error, error) {
			tx := s.Begin()
			return tx, func() error { return tx.Commit(ctx) },
				func() error { return tx.Rollback(context.Background()) }, nil
		},
	}
}

// TestConformance runs the fence conformance suite against the Redis at BATON_REDIS_ADDR. The
// shared server runs without an append-only file, so the store is told to accept that; the
// durability across a restart is TestRestartLosesNothing's, on a server of its own.
func TestConformance(t *testing.T) {
	addr := testenv.RedisAddr(t)
	fencetest.Run(t, func(t *testing.T) fencetest.Env[*Tx] {
		c := client(t, addr)
		prefix, user := testPrefixes(t, c)
		return envFor(t, c, prefix, user, AllowLosingAcknowledgedWrites())
	})
}

// TestConformanceOnADurableServer runs the suite again, each case on a redis-server of its own
// with appendfsync always and without AllowLosingAcknowledgedWrites: the store's default path.
// Its Durability case reopens by killing the server (SIGKILL) and starting it over its
// append-only file.
func TestConformanceOnADurableServer(t *testing.T) {
	fencetest.Run(t, func(t *testing.T) fencetest.Env[*Tx] {
		srv := testenv.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always")
		return durableEnv(t, srv)
	})
}

func durableEnv(t testing.TB, srv *testenv.RedisServer) fencetest.Env[*Tx] {
	t.Helper()
	env := envFor(t, client(t, srv.Addr), "baton:", "user:")
	env.Reopen = func(t testing.TB) fencetest.Env[*Tx] {
		srv.Kill()
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		return durableEnv(t, srv)
	}
	return env
}
