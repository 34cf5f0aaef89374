package redisfence

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// writeUntilKilled claims k and applies batches of one position each (a field per position and
// a counter, in one transaction) until the server is killed midway; it returns the last
// position acknowledged.
func writeUntilKilled(t *testing.T, srv *testenv.RedisServer, s *Store) int64 {
	t.Helper()
	ctx := testenv.Context(t, 60*time.Second)
	k := fence.Key{Group: "g", Topic: "restart", Partition: 0}
	if _, err := s.Claim(ctx, k, fence.Token{Epoch: 5}, "owner"); err != nil {
		t.Fatal(err)
	}
	// The kill comes after 20 acknowledged batches, not after a fixed time: a loaded machine
	// must not turn the test into one that killed an idle server.
	killed := make(chan struct{})
	var progress atomic.Int64
	go func() {
		defer close(killed)
		for deadline := time.Now().Add(30 * time.Second); progress.Load() < 20 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		srv.Kill()
	}()
	acked := fence.NoPosition
	for p := int64(0); ; p++ {
		err := s.Apply(ctx, k, fence.Token{Epoch: 5}, p, p, func(ctx context.Context, tx *Tx) error {
			tx.HSet("data", strconv.FormatInt(p, 10), "v")
			tx.HIncrBy("count", "n", 1)
			return nil
		})
		if err != nil {
			break
		}
		acked = p
		progress.Store(p + 1)
	}
	<-killed
	t.Logf("%d batches acknowledged before the kill", acked+1)
	if acked < 10 {
		t.Fatalf("only %d batches were acknowledged before the kill: the run did not get going", acked+1)
	}
	return acked
}

// TestRestartLosesNothing kills a server with appendonly yes and appendfsync always in the
// middle of a run of batches and restarts it: every acknowledged batch is there, with its
// fence, the fence and the data agree (the one batch whose reply was lost is all there or
// not at all), and the old owner's lower token is still refused.
func TestRestartLosesNothing(t *testing.T) {
	srv := testenv.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	c := client(t, srv.Addr)
	s, err := New(c) // no AllowLosingAcknowledgedWrites: this server must pass the check
	if err != nil {
		t.Fatal(err)
	}
	acked := writeUntilKilled(t, srv, s)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}

	ctx := testenv.Context(t, 30*time.Second)
	c2 := client(t, srv.Addr)
	s2, err := New(c2)
	if err != nil {
		t.Fatal(err)
	}
	k := fence.Key{Group: "g", Topic: "restart", Partition: 0}
	st, err := s2.Load(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if st.Token != (fence.Token{Epoch: 5}) || st.Claimant != "owner" || st.Position < acked || st.Position > acked+1 {
		t.Fatalf("after the restart the fence is %+v; %d was acknowledged", st, acked)
	}
	n, err := c2.HGet(ctx, "count", "n").Int64()
	if err != nil || n != st.Position+1 {
		t.Fatalf("after the restart the counter is %d (%v), the fence at %d: data and fence disagree", n, err, st.Position)
	}
	fields, err := c2.HLen(ctx, "data").Result()
	if err != nil || fields != st.Position+1 {
		t.Fatalf("after the restart %d positions are written (%v), the fence is at %d", fields, err, st.Position)
	}
	if _, err := s2.Claim(ctx, k, fence.Token{Epoch: 4}, "zombie"); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("a lower claim after the restart = %v, want ErrStale", err)
	}
	err = s2.Apply(ctx, k, fence.Token{Epoch: 5}, st.Position, st.Position, func(context.Context, *Tx) error { return nil })
	if !errors.Is(err, fence.ErrDuplicate) {
		t.Fatalf("re-applying position %d after the restart = %v, want ErrDuplicate", st.Position, err)
	}
}

// TestRestartWithoutAOFLosesTheFence is what the check prevents: the store refuses a server
// without an append-only file, and, told to accept it, loses every fence on a restart, so
// that a zombie's lower token is accepted again.
func TestRestartWithoutAOFLosesTheFence(t *testing.T) {
	srv := testenv.StartRedis(t, "--appendonly", "no")
	c := client(t, srv.Addr)
	if s, _ := New(c); !errors.Is(s.Check(t.Context()), ErrNotDurable) {
		t.Fatal("the store accepted a server without an append-only file")
	}
	s, err := New(c, AllowLosingAcknowledgedWrites())
	if err != nil {
		t.Fatal(err)
	}
	writeUntilKilled(t, srv, s)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	s2, _ := New(client(t, srv.Addr), AllowLosingAcknowledgedWrites())
	k := fence.Key{Group: "g", Topic: "restart", Partition: 0}
	if _, err := s2.Claim(t.Context(), k, fence.Token{Epoch: 4}, "zombie"); err != nil {
		t.Fatalf("the zombie's claim after the restart = %v: the fence survived, so this test shows nothing", err)
	}
}

// TestCheckWithoutConfig: a user not permitted CONFIG (as on managed services that rename it
// away) cannot have the settings read; the store refuses unless told to accept the risk.
func TestCheckWithoutConfig(t *testing.T) {
	srv := testenv.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	ctx := testenv.Context(t, 30*time.Second)
	admin := client(t, srv.Addr)
	if err := admin.Do(ctx, "ACL", "SETUSER", "noconfig", "on", ">pw", "~*", "&*", "+@all", "-config").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "noconfig", Password: "pw"})
	t.Cleanup(func() { _ = c.Close() })
	s, _ := New(c)
	err := s.Check(ctx)
	if !errors.Is(err, ErrNotDurable) || !strings.Contains(err.Error(), "cannot be read") {
		t.Fatalf("Check without CONFIG = %v, want ErrNotDurable: the settings cannot be read", err)
	}
	s, _ = New(c, AllowLosingAcknowledgedWrites())
	if _, err := s.Claim(ctx, fence.Key{Group: "g", Topic: "t"}, fence.Token{Epoch: 1}, "me"); err != nil {
		t.Fatalf("Claim with AllowLosingAcknowledgedWrites and no CONFIG: %v", err)
	}
	if s2, _ := New(admin); s2.Check(ctx) != nil {
		t.Fatalf("the same server, read by a user allowed CONFIG, was refused: %v", s2.Check(ctx))
	}
}

// TestCheckRefusesEachLossySetting: each setting that can lose an acknowledged write is
// refused and named; with all of them right the store starts, without the option.
func TestCheckRefusesEachLossySetting(t *testing.T) {
	srv := testenv.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	ctx := testenv.Context(t, 30*time.Second)
	c := client(t, srv.Addr)
	good := map[string]string{"appendonly": "yes", "appendfsync": "always", "no-appendfsync-on-rewrite": "no", "maxmemory-policy": "noeviction"}
	set := func(kv map[string]string) {
		t.Helper()
		for k, v := range kv {
			if err := c.ConfigSet(ctx, k, v).Err(); err != nil {
				t.Fatalf("CONFIG SET %s %s: %v", k, v, err)
			}
		}
	}
	for _, bad := range []struct{ key, value string }{
		{"appendonly", "no"},
		{"appendfsync", "everysec"},
		{"appendfsync", "no"},
		{"no-appendfsync-on-rewrite", "yes"},
		{"maxmemory-policy", "allkeys-lru"},
	} {
		set(good)
		set(map[string]string{bad.key: bad.value})
		s, _ := New(c)
		err := s.Check(ctx)
		if !errors.Is(err, ErrNotDurable) || !strings.Contains(err.Error(), bad.key+" "+bad.value) {
			t.Errorf("%s %s: Check = %v, want ErrNotDurable naming it", bad.key, bad.value, err)
		}
	}
	set(good)
	set(map[string]string{"maxmemory-policy": "volatile-lru"}) // evicts only keys with a TTL
	if s, _ := New(c); s.Check(ctx) != nil {
		t.Errorf("Check on the durable settings: %v", s.Check(ctx))
	}
}

// TestClusterOneSlotPerTransaction runs the store on a Redis Cluster of one node (all 16384
// slots, so the cluster's rules apply to every key): a transaction whose keys carry the
// topic's hash tag runs, one with a key in another slot is refused before it runs and writes
// nothing, a recreated topic's fences move in one script, and an admission (tagged by its
// scope) cannot share a transaction with a partition's fence.
func TestClusterOneSlotPerTransaction(t *testing.T) {
	srv := testenv.StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--appendonly", "yes", "--appendfsync", "always")
	ctx := testenv.Context(t, 30*time.Second)
	admin := client(t, srv.Addr)
	if err := admin.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", "0", "16383").Err(); err != nil {
		t.Fatal(err)
	}
	for {
		info, err := admin.ClusterInfo(ctx).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the cluster never became ok: %v %s", err, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.Addr}})
	t.Cleanup(func() { _ = cc.Close() })
	s, err := New(cc)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); err != nil || !s.isCluster() {
		t.Fatalf("Check on a cluster = %v, cluster %v", err, s.isCluster())
	}
	k := fence.Key{Group: "g", Topic: "t", Partition: 0}
	tagged := "twin:" + HashTag(k.Group, k.Topic) + ":d1"
	if _, err := s.Claim(ctx, k, fence.Token{Epoch: 1}, "me"); err != nil {
		t.Fatal(err)
	}
	err = s.Apply(ctx, k, fence.Token{Epoch: 1}, 0, 0, func(ctx context.Context, tx *Tx) error {
		tx.HSet(tagged, "reading", "1")
		return nil
	})
	if err != nil {
		t.Fatalf("Apply with the topic's tag on a cluster: %v", err)
	}
	err = s.Apply(ctx, k, fence.Token{Epoch: 1}, 1, 1, func(ctx context.Context, tx *Tx) error {
		tx.HSet(tagged, "reading", "2")
		tx.HSet("twin:d2", "reading", "2")
		return nil
	})
	if !errors.Is(err, ErrCrossSlot) {
		t.Fatalf("Apply with a key in another slot = %v, want ErrCrossSlot", err)
	}
	if v, _ := cc.HGet(ctx, tagged, "reading").Result(); v != "1" {
		t.Fatalf("after the refusal %s reads %q, want 1", tagged, v)
	}
	if st, _ := s.Load(ctx, k); st.Position != 0 {
		t.Fatalf("after the refusal the fence is at %d, want 0", st.Position)
	}
	// The server refuses such a script too, before it runs: were the store's check missing,
	// nothing would be written either.
	s.mu.Lock()
	s.cluster = false
	s.mu.Unlock()
	err = s.Apply(ctx, k, fence.Token{Epoch: 1}, 1, 1, func(ctx context.Context, tx *Tx) error {
		tx.HSet(tagged, "reading", "2")
		tx.HSet("twin:d2", "reading", "2")
		return nil
	})
	if err == nil || errors.Is(err, ErrCrossSlot) {
		t.Fatalf("a cross-slot script sent to the cluster = %v, want the server's refusal", err)
	}
	t.Logf("the server's refusal: %v", err)
	if v, _ := cc.HGet(ctx, tagged, "reading").Result(); v != "1" {
		t.Fatalf("after the server's refusal %s reads %q, want 1", tagged, v)
	}
	s.mu.Lock()
	s.cluster = true
	s.mu.Unlock()
	err = s.Apply(ctx, k, fence.Token{Epoch: 1}, 1, 1, func(ctx context.Context, tx *Tx) error {
		_, err := s.Admit(ctx, tx, "inbox", "m", fence.Token{Epoch: 1}, 1)
		return err
	})
	if !errors.Is(err, ErrCrossSlot) {
		t.Fatalf("an admission with a partition's fence on a cluster = %v, want ErrCrossSlot", err)
	}
	tx := s.Begin() // alone, an admission runs
	if v, err := s.Admit(ctx, tx, "inbox", "m", fence.Token{Epoch: 1}, 1); err != nil || v != fence.Admitted {
		t.Fatalf("Admit = %s, %v", v, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit of an admission alone on a cluster: %v", err)
	}
	if _, _, err := s.SeeTopic(ctx, k.Group, k.Topic, fence.Topic{ID: "a", Partitions: 2}, "test"); err != nil {
		t.Fatal(err)
	}
	if err := s.ResetTopic(ctx, k.Group, k.Topic, fence.Topic{ID: "a", Partitions: 2}, fence.Topic{ID: "b", Partitions: 2}, "test: recreated"); err != nil {
		t.Fatalf("ResetTopic on a cluster: %v", err)
	}
	if st, _ := s.Load(ctx, k); st.Token != (fence.Token{Era: 1}) || st.Position != fence.NoPosition {
		t.Fatalf("after the reset the fence is %+v, want era 1, no position", st)
	}
}
