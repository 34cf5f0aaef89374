package redisfence

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

func TestSlotMatchesRedisCluster(t *testing.T) {
	// The values CLUSTER KEYSLOT gives, and the hash-tag rule of the cluster specification.
	for key, want := range map[string]uint16{"123456789": 12739, "foo": 12182, "bar": 5061, "{foo}x": 12182, "a{foo}b{bar}": 12182, "{}foo": slot("{}foo")} {
		if got := slot(key); got != want {
			t.Errorf("slot(%q) = %d, want %d", key, got, want)
		}
	}
	if slot("{}foo") == slot("") {
		t.Error("an empty hash tag must not count: the whole key is hashed")
	}
}

func TestKeysOfATopicShareASlotAndNameOneThing(t *testing.T) {
	n := keys{prefix: defaultPrefix}
	k := fence.Key{Group: "g{1}", Topic: "t/x:y", Partition: 7}
	tag := HashTag(k.Group, k.Topic)
	want := slot(tag)
	for _, key := range []string{n.fence(k), hold(n.fence(k)), n.recovery(k), n.partitions(k.Group, k.Topic),
		n.identity(k.Group, k.Topic), n.history(k.Group, k.Topic), "twin:" + tag + ":dev-7"} {
		if slot(key) != want {
			t.Errorf("%q is in slot %d, the topic's tag %q in %d", key, slot(key), tag, want)
		}
	}
	// Names that would collide without escaping get distinct keys.
	pairs := [][2]fence.Key{
		{{Group: "a/b", Topic: "c"}, {Group: "a", Topic: "b/c"}},
		{{Group: "a}", Topic: "b"}, {Group: "a", Topic: "}b"}},
		{{Group: "a%2Fb", Topic: "c"}, {Group: "a/b", Topic: "c"}},
	}
	for _, p := range pairs {
		if n.fence(p[0]) == n.fence(p[1]) {
			t.Errorf("%v and %v share the key %q", p[0], p[1], n.fence(p[0]))
		}
	}
	if a, b := n.admit("s", "x:hold"), hold(n.admit("s", "x")); a == b {
		t.Errorf("the keyed fence of id x:hold is the hold of id x: %q", a)
	}
	if a, b := n.admit("s:admit:x", "y"), n.admit("s", "x:admit:y"); a == b {
		t.Errorf("two (scope, id) share the key %q", a)
	}
}

func TestNewValidates(t *testing.T) {
	if _, err := New(nil); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("New(nil) = %v, want ErrInvalid", err)
	}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	for _, p := range []string{"", "a{b", "a}", "x y", strings.Repeat("p", 64)} {
		if _, err := New(c, Prefix(p)); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("Prefix(%q): %v, want ErrInvalid", p, err)
		}
	}
}

// TestNewRefusesARing: a Ring spreads a pipeline over its shards and sends a command without
// a key (WAIT, INFO, CONFIG) to a random one, so the store could neither check the servers
// that keep its fences nor wait on the connection of its script.
func TestNewRefusesARing(t *testing.T) {
	r := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer r.Close()
	if _, err := New(r); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("New(a *redis.Ring) = %v, want ErrInvalid", err)
	}
}

// offline returns a store whose server was checked as a cluster and that reaches no server:
// whatever it refuses, it refused before any I/O.
func offline(t *testing.T) *Store {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	s, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	s.checked, s.cluster = true, true
	return s
}

func TestCrossSlotRefusedBeforeRunning(t *testing.T) {
	s := offline(t)
	k := fence.Key{Group: "g", Topic: "t", Partition: 0}
	err := s.Apply(t.Context(), k, fence.Token{}, 0, 0, func(ctx context.Context, tx *Tx) error {
		tx.HSet("twin:"+HashTag(k.Group, k.Topic)+":dev-1", "temp", "20")
		tx.HSet("twin:dev-2", "temp", "21") // no hash tag: another slot
		return nil
	})
	if !errors.Is(err, ErrCrossSlot) || !strings.Contains(err.Error(), "twin:dev-2") {
		t.Fatalf("Apply with a key in another slot = %v, want ErrCrossSlot naming the key", err)
	}
	tx := s.Begin()
	if _, err := s.Admit(t.Context(), tx, "inbox", "m", fence.Token{}, 0); err == nil {
		t.Fatal("Admit reached no server, yet succeeded")
	}
	_ = tx.Rollback(t.Context())
	// Keys with the topic's tag pass the check and reach for the (absent) server.
	err = s.Apply(t.Context(), k, fence.Token{}, 0, 0, func(ctx context.Context, tx *Tx) error {
		tx.HSet("twin:"+HashTag(k.Group, k.Topic)+":dev-1", "temp", "20")
		return nil
	})
	if err == nil || errors.Is(err, ErrCrossSlot) {
		t.Fatalf("Apply with the topic's tag = %v, want a connection error", err)
	}
}

func TestQueuedCommandErrorsFailTheCommit(t *testing.T) {
	s := offline(t)
	k := fence.Key{Group: "g", Topic: "t", Partition: 0}
	for name, queue := range map[string]func(tx *Tx){
		"odd pairs":          func(tx *Tx) { tx.HSet("h", "f") },
		"no pairs":           func(tx *Tx) { tx.XAdd("s") },
		"empty key":          func(tx *Tx) { tx.Set("", "v") },
		"the store's prefix": func(tx *Tx) { tx.Del(defaultPrefix + "{g/t}:fence:0") },
		"huge increment":     func(tx *Tx) { tx.HIncrBy("h", "f", 1<<53) },
		"expiry below 1ms":   func(tx *Tx) { tx.Expire("h", time.Microsecond) },
	} {
		err := s.Apply(t.Context(), k, fence.Token{}, 0, 0, func(ctx context.Context, tx *Tx) error {
			tx.Set("ok-"+HashTag("g", "t"), "v")
			queue(tx)
			return nil
		})
		if !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s: Apply = %v, want ErrInvalid", name, err)
		}
	}
}

// shared returns a store on the shared server under a prefix of its own, and a client.
func shared(t *testing.T, opts ...Option) (*Store, *redis.Client, string) {
	t.Helper()
	c := client(t, testenv.RedisAddr(t))
	prefix, user := testPrefixes(t, c)
	s, err := New(c, append([]Option{Prefix(prefix), AllowLosingAcknowledgedWrites()}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return s, c, user
}

// TestRefusedCommandWritesNothing: a transaction whose command would fail on the server is
// refused whole: the commands before it, the fence advance and the admission are not written.
func TestRefusedCommandWritesNothing(t *testing.T) {
	s, c, user := shared(t)
	ctx := testenv.Context(t, 30*time.Second)
	k := fence.Key{Group: "g", Topic: "refused", Partition: 0}
	if _, err := s.Claim(ctx, k, fence.Token{Epoch: 1}, "me"); err != nil {
		t.Fatal(err)
	}
	str, hash := user+"str", user+"hash"
	if err := c.Set(ctx, str, "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.HSet(ctx, hash, "name", "dev", "big", fmt.Sprint(int64(1)<<53-1)).Err(); err != nil {
		t.Fatal(err)
	}
	for name, queue := range map[string]func(tx *Tx){
		"HSET on a string":              func(tx *Tx) { tx.HSet(str, "f", "v") },
		"XADD on a hash":                func(tx *Tx) { tx.XAdd(hash, "f", "v") },
		"HINCRBY of a text field":       func(tx *Tx) { tx.HIncrBy(hash, "name", 1) },
		"HINCRBY past 2^53":             func(tx *Tx) { tx.HIncrBy(hash, "big", 1) },
		"HSET after SET in the same tx": func(tx *Tx) { tx.Set(user+"new", "v"); tx.HSet(user+"new", "f", "v") },
		"HINCRBY after HSET of text":    func(tx *Tx) { tx.HSet(user+"h2", "n", "ten"); tx.HIncrBy(user+"h2", "n", 1) },
	} {
		err := s.Apply(ctx, k, fence.Token{Epoch: 1}, 0, 0, func(ctx context.Context, tx *Tx) error {
			tx.HSet(user+"before", "v", "written?")
			if _, err := s.Admit(ctx, tx, "inbox", "m", fence.Token{Epoch: 1}, 1); err != nil {
				return err
			}
			queue(tx)
			return nil
		})
		if !errors.Is(err, ErrCommand) {
			t.Fatalf("%s: Apply = %v, want ErrCommand", name, err)
		}
		if n, err := c.Exists(ctx, user+"before", user+"new", user+"h2").Result(); err != nil || n != 0 {
			t.Fatalf("%s: %d keys of the refused transaction exist (%v)", name, n, err)
		}
		if st, err := s.Load(ctx, k); err != nil || st.Position != fence.NoPosition {
			t.Fatalf("%s: fence after the refusal = %+v, %v; want no position", name, st, err)
		}
	}
	// The admission was not stored, and its hold was released: the same message is new.
	tx := s.Begin()
	v, err := s.Admit(ctx, tx, "inbox", "m", fence.Token{Epoch: 1}, 1)
	if err != nil || v != fence.Admitted {
		t.Fatalf("Admit after the refusals = %s, %v; want admitted", v, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// The commands that cannot fail run, in order.
	err = s.Apply(ctx, k, fence.Token{Epoch: 1}, 0, 0, func(ctx context.Context, tx *Tx) error {
		tx.HIncrBy(hash, "count", 2)
		tx.HIncrBy(hash, "count", 3)
		tx.Set(user+"s", "v")
		tx.Del(user + "s")
		tx.XAdd(user+"stream", "f", "v")
		tx.Set(str, "y")
		tx.Expire(str, time.Hour)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := c.HGet(ctx, hash, "count").Result(); n != "5" {
		t.Errorf("count = %q, want 5", n)
	}
	if n, _ := c.Exists(ctx, user+"s").Result(); n != 0 {
		t.Error("SET then DEL left the key")
	}
	if n, _ := c.XLen(ctx, user+"stream").Result(); n != 1 {
		t.Errorf("stream length %d, want 1", n)
	}
	if ttl, _ := c.PTTL(ctx, str).Result(); ttl <= 0 || ttl > time.Hour {
		t.Errorf("TTL of %s = %s, want about an hour", str, ttl)
	}
}

// TestCheckReadsTheServersSettings: without AllowLosingAcknowledgedWrites the store accepts
// the shared server only if it fsyncs every write; with it, any.
func TestCheckReadsTheServersSettings(t *testing.T) {
	c := client(t, testenv.RedisAddr(t))
	ctx := testenv.Context(t, 30*time.Second)
	cfg, err := c.ConfigGet(ctx, "append*").Result()
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	err = s.Check(ctx)
	if durable := cfg["appendonly"] == "yes" && cfg["appendfsync"] == "always"; durable != (err == nil) {
		t.Fatalf("Check on appendonly %s, appendfsync %s = %v", cfg["appendonly"], cfg["appendfsync"], err)
	}
	if err != nil {
		if !errors.Is(err, ErrNotDurable) || !strings.Contains(err.Error(), "appendfsync") {
			t.Fatalf("Check = %v, want ErrNotDurable naming the setting", err)
		}
		// The first use checks too.
		if _, err := s.Load(ctx, fence.Key{Group: "g", Topic: "t"}); !errors.Is(err, ErrNotDurable) {
			t.Fatalf("Load on a lossy server = %v, want ErrNotDurable", err)
		}
	}
	s, _ = New(c, AllowLosingAcknowledgedWrites())
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check with AllowLosingAcknowledgedWrites: %v", err)
	}
}
