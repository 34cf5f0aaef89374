package redisfence

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// replicated is a primary and its replica, both the test's own, with appendfsync always: what
// a failover loses here, no fsync setting prevents.
type replicated struct {
	primary, replica *testenv.RedisServer
	pc, rc           *redis.Client // admin clients
	replicaPID       int
}

func startReplicated(t *testing.T) *replicated {
	t.Helper()
	rs := startPrimary(t)
	rs.attachReplica(t)
	return rs
}

var durableArgs = []string{"--appendonly", "yes", "--appendfsync", "always"}

// startPrimary starts the primary alone; attachReplica gives it its replica.
func startPrimary(t *testing.T) *replicated {
	t.Helper()
	p := testenv.StartRedis(t, append(durableArgs, "--repl-diskless-sync-delay", "0")...)
	return &replicated{primary: p, pc: client(t, p.Addr)}
}

// attachReplica starts the replica of rs's primary and waits until it is in sync.
func (rs *replicated) attachReplica(t *testing.T) {
	t.Helper()
	ctx := testenv.Context(t, 15*time.Second)
	host, port, _ := net.SplitHostPort(rs.primary.Addr)
	rs.replica = testenv.StartRedis(t, append(durableArgs, "--replicaof", host, port)...)
	rs.rc = client(t, rs.replica.Addr)
	for {
		info, err := rs.rc.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the replica never synchronized: %v %s", err, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
	info, err := rs.rc.Info(ctx, "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			rs.replicaPID, _ = strconv.Atoi(v)
		}
	}
	if rs.replicaPID == 0 {
		t.Fatalf("no process_id in INFO server: %s", info)
	}
	t.Cleanup(func() { _ = syscall.Kill(rs.replicaPID, syscall.SIGCONT) })
}

// synced waits until the replica has everything the primary has written.
func (rs *replicated) synced(t *testing.T) {
	t.Helper()
	if n, err := rs.pc.Wait(t.Context(), 1, 5*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v: the replica did not catch up", n, err)
	}
}

// freezeReplica stops the replica (SIGSTOP): it confirms nothing until resumeReplica, though
// what the primary sends still reaches its socket.
func (rs *replicated) freezeReplica(t *testing.T) {
	t.Helper()
	if err := syscall.Kill(rs.replicaPID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
}

// cutReplica freezes the replica and has the primary drop its link: nothing the primary
// writes from now on reaches the replica until it reconnects, which it cannot do frozen.
func (rs *replicated) cutReplica(t *testing.T) {
	t.Helper()
	rs.freezeReplica(t)
	if err := rs.pc.Do(t.Context(), "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}
}

func (rs *replicated) resumeReplica(t *testing.T) {
	t.Helper()
	if err := syscall.Kill(rs.replicaPID, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
}

// failover kills the primary (SIGKILL), resumes the replica and promotes it (REPLICAOF NO
// ONE), as Sentinel would, and returns a store on it.
func (rs *replicated) failover(t *testing.T) *Store {
	t.Helper()
	rs.primary.Kill()
	rs.resumeReplica(t)
	if err := rs.rc.Do(t.Context(), "REPLICAOF", "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	s, err := New(rs.rc)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var (
	failoverKey = fence.Key{Group: "g", Topic: "failover", Partition: 0}
	zombieToken = fence.Token{Epoch: 1}
	ownerToken  = fence.Token{Epoch: 2}
)

func write(v string) func(context.Context, *Tx) error {
	return func(_ context.Context, tx *Tx) error {
		tx.HSet("twin", "v", v)
		return nil
	}
}

// TestFailoverWithoutWaitLosesTheClaim is what asynchronous replication costs, whatever the
// fsync setting, once AllowLosingAcknowledgedWrites stops the store from waiting for the
// replica: a claim and a batch acknowledged by the primary but not yet received by the
// replica are gone after the replica is promoted, and the deposed owner's token, which only
// the lost claim had outranked, is admitted again.
func TestFailoverWithoutWaitLosesTheClaim(t *testing.T) {
	rs := startReplicated(t)
	ctx := testenv.Context(t, 15*time.Second)
	s, err := New(rs.pc, AllowLosingAcknowledgedWrites())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, failoverKey, zombieToken, "zombie"); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(ctx, failoverKey, zombieToken, 0, 0, write("zombie 0")); err != nil {
		t.Fatal(err)
	}
	rs.synced(t)
	rs.cutReplica(t)
	if _, err := s.Claim(ctx, failoverKey, ownerToken, "owner"); err != nil {
		t.Fatalf("the owner's claim: %v", err)
	}
	if err := s.Apply(ctx, failoverKey, ownerToken, 1, 1, write("owner 1")); err != nil {
		t.Fatalf("the owner's batch: %v", err)
	}
	// Both acknowledged; the replica has neither.
	s2 := rs.failover(t)
	st, err := s2.Load(ctx, failoverKey)
	if err != nil {
		t.Fatal(err)
	}
	if st.Token != zombieToken || st.Position != 0 {
		t.Fatalf("after the failover the fence is %+v: the acknowledged claim survived, so this test shows nothing", st)
	}
	if err := s2.Apply(ctx, failoverKey, zombieToken, 1, 1, write("zombie 1")); err != nil {
		t.Fatalf("the zombie's batch after the failover = %v; the fence went back to its token, so it is admitted", err)
	}
	t.Logf("after the failover the fence is back at %s (claimed by %q) and the zombie's batch was admitted", st.Token, st.Claimant)
}

// untilReplicated retries f, as the consumer does, while it fails with ErrNotDurable (the
// replica did not confirm).
func untilReplicated(ctx context.Context, f func() error) error {
	for {
		err := f()
		if !errors.Is(err, ErrNotDurable) || ctx.Err() != nil {
			return err
		}
	}
}

// TestFailoverWithWaitKeepsTheClaim: on a primary with a replica the store waits for it, so
// the owner's claim is not answered while the replica cannot confirm it, and once answered
// it survives the same failover: the promoted replica refuses the zombie.
func TestFailoverWithWaitKeepsTheClaim(t *testing.T) {
	rs := startReplicated(t)
	ctx := testenv.Context(t, 15*time.Second)
	s, err := New(rs.pc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, failoverKey, zombieToken, "zombie"); err != nil {
		t.Fatal(err)
	}
	rs.cutReplica(t)
	claimed := make(chan error, 1)
	go func() {
		claimed <- untilReplicated(ctx, func() error {
			_, err := s.Claim(ctx, failoverKey, ownerToken, "owner")
			return err
		})
	}()
	select {
	case err := <-claimed:
		t.Fatalf("the owner's claim was answered (%v) while the replica was stopped", err)
	case <-time.After(300 * time.Millisecond):
	}
	rs.resumeReplica(t)
	if err := <-claimed; err != nil {
		t.Fatalf("the owner's claim once the replica resumed: %v", err)
	}
	if err := s.Apply(ctx, failoverKey, ownerToken, 0, 0, write("owner 0")); err != nil {
		t.Fatalf("the owner's batch: %v", err)
	}
	// Acknowledged: the primary dies now, before anything else reaches the replica.
	s2 := rs.failover(t)
	st, err := s2.Load(ctx, failoverKey)
	if err != nil {
		t.Fatal(err)
	}
	if st.Token != ownerToken || st.Position != 0 {
		t.Fatalf("after the failover the fence is %+v, want the owner's acknowledged claim and batch", st)
	}
	if err := s2.Apply(ctx, failoverKey, zombieToken, 1, 1, write("zombie 1")); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("the zombie's batch after the failover = %v, want ErrStale", err)
	}
}

// TestWaitRefusesToAcknowledgeUnreplicated: while the replica is stopped a batch fails with
// ErrNotDurable, and so does its retry through another connection, which the primary answers
// as a duplicate (it has the batch) but the replica does not have; once the replica resumes,
// the retry is answered fence.ErrDuplicate. With AllowLosingAcknowledgedWrites the store does
// not wait.
func TestWaitRefusesToAcknowledgeUnreplicated(t *testing.T) {
	rs := startReplicated(t)
	ctx := testenv.Context(t, 15*time.Second)
	s, err := New(rs.pc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, failoverKey, ownerToken, "owner"); err != nil {
		t.Fatal(err)
	}
	rs.freezeReplica(t)
	if err := s.Apply(ctx, failoverKey, ownerToken, 0, 0, write("owner 0")); !errors.Is(err, ErrNotDurable) {
		t.Fatalf("a batch while the replica is stopped = %v, want ErrNotDurable", err)
	}
	// A store on a fresh client (the frozen replica is still connected, so it waits for it),
	// whose connection wrote nothing: WAIT is documented to count a connection's own writes,
	// and the store's PUBLISH makes it count everything before the duplicate's answer. (Redis
	// 7.0's WAIT counts everything up to the connection's last command of any kind, so on 7.0
	// this passes without the PUBLISH too; from 7.2 it needs it.)
	retry, err := New(client(t, rs.primary.Addr))
	if err != nil {
		t.Fatal(err)
	}
	if err := retry.Apply(ctx, failoverKey, ownerToken, 0, 0, write("owner 0")); !errors.Is(err, ErrNotDurable) {
		t.Fatalf("the retry while the replica is stopped = %v, want ErrNotDurable: the primary's answer is not acknowledged", err)
	}
	unwaited, err := New(client(t, rs.primary.Addr), AllowLosingAcknowledgedWrites())
	if err != nil {
		t.Fatal(err)
	}
	if err := unwaited.Apply(ctx, failoverKey, ownerToken, 0, 0, write("owner 0")); !errors.Is(err, fence.ErrDuplicate) {
		t.Fatalf("the retry without waiting = %v, want ErrDuplicate at once", err)
	}
	rs.resumeReplica(t)
	err = untilReplicated(ctx, func() error { return retry.Apply(ctx, failoverKey, ownerToken, 0, 0, write("owner 0")) })
	if !errors.Is(err, fence.ErrDuplicate) {
		t.Fatalf("the retry once the replica resumed = %v, want ErrDuplicate", err)
	}
}

// TestWaitCountsAReplicaAttachedAfterTheCheck: a replica that attaches after the store checked
// the server (none was connected then: not yet started, or reconnecting) is waited for from
// then on. While it is stopped, a claim is not answered, since a failover to it would lose
// the claim.
func TestWaitCountsAReplicaAttachedAfterTheCheck(t *testing.T) {
	rs := startPrimary(t)
	ctx := testenv.Context(t, 15*time.Second)
	s, err := New(rs.pc)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, failoverKey, zombieToken, "zombie"); err != nil {
		t.Fatal(err)
	}
	rs.attachReplica(t)
	rs.freezeReplica(t)
	if _, err := s.Claim(ctx, failoverKey, ownerToken, "owner"); !errors.Is(err, ErrNotDurable) {
		t.Fatalf("the owner's claim while the replica attached after the check is stopped = %v, want ErrNotDurable", err)
	}
	rs.resumeReplica(t)
	err = untilReplicated(ctx, func() error {
		_, err := s.Claim(ctx, failoverKey, ownerToken, "owner")
		return err
	})
	if err != nil {
		t.Fatalf("the owner's claim once the replica resumed: %v", err)
	}
	rs.freezeReplica(t)
	if err := s.Apply(ctx, failoverKey, ownerToken, 0, 0, write("owner 0")); !errors.Is(err, ErrNotDurable) {
		t.Fatalf("a batch while the replica is stopped = %v, want ErrNotDurable", err)
	}
}

// TestWaitNeedsThePublish: the PUBLISH is what makes WAIT cover a write the connection did not
// make itself (a retried batch answered as a duplicate, on a connection whose own last write
// the replica already has). A user who may not publish to the store's channel (Redis 7 gives a
// new ACL user no channel unless acl-pubsub-default says otherwise) is refused by the check,
// and a PUBLISH refused later fails the write instead of acknowledging what the replica does
// not have.
func TestWaitNeedsThePublish(t *testing.T) {
	rs := startReplicated(t)
	ctx := testenv.Context(t, 15*time.Second)
	acl := func(rules ...any) {
		t.Helper()
		if err := rs.pc.Do(ctx, append([]any{"ACL", "SETUSER", "app"}, rules...)...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	app := func() *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: rs.primary.Addr, Username: "app", Password: "pw", DisableIdentity: true, PoolSize: 1})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	acl("on", ">pw", "~*", "+@all", "resetchannels")
	if s, _ := New(app()); !errors.Is(s.Check(ctx), ErrNotDurable) {
		t.Fatalf("Check for a user who may not publish = %v, want ErrNotDurable", s.Check(ctx))
	}
	acl("&*")
	s, err := New(app())
	if err != nil {
		t.Fatal(err)
	}
	retry, err := New(app())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := retry.Claim(ctx, failoverKey, ownerToken, "owner"); err != nil {
		t.Fatal(err)
	}
	rs.freezeReplica(t)
	if err := s.Apply(ctx, failoverKey, ownerToken, 0, 0, write("owner 0")); !errors.Is(err, ErrNotDurable) {
		t.Fatalf("a batch while the replica is stopped = %v, want ErrNotDurable", err)
	}
	// The retry, on the connection whose last write (the claim) the replica has, by a user who
	// may no longer publish.
	acl("resetchannels")
	err = retry.Apply(ctx, failoverKey, ownerToken, 0, 0, write("owner 0"))
	if err == nil || errors.Is(err, fence.ErrDuplicate) {
		t.Fatalf("the retry while the replica is stopped and the PUBLISH refused = %v: a batch the replica does not have is acknowledged", err)
	}
	// Redis 7.0 lets WAIT cover what the primary had when the connection's last command ran,
	// any command; from 7.2 only what the connection itself propagated, so there the unchecked
	// PUBLISH is an ErrDuplicate. The refusal must be what the error names, on either.
	if !errors.Is(err, ErrNotDurable) || !strings.Contains(err.Error(), "PUBLISH") {
		t.Fatalf("the retry while the PUBLISH is refused = %v, want ErrNotDurable naming the PUBLISH", err)
	}
}

// TestCheckRefusesAClusterWithReplicas: the store does not wait for a Redis Cluster's
// replicas, so a cluster with one is refused like any server that can lose an acknowledged
// write, unless AllowLosingAcknowledgedWrites names the risk.
func TestCheckRefusesAClusterWithReplicas(t *testing.T) {
	ctx := testenv.Context(t, 30*time.Second)
	node := func() (*testenv.RedisServer, *redis.Client) {
		srv := testenv.StartRedis(t, append(durableArgs, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")...)
		return srv, client(t, srv.Addr)
	}
	primary, pc := node()
	_, rc := node()
	if err := pc.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", "0", "16383").Err(); err != nil {
		t.Fatal(err)
	}
	id, err := pc.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(primary.Addr)
	if err := rc.ClusterMeet(ctx, host, port).Err(); err != nil {
		t.Fatal(err)
	}
	for {
		nodes, err := rc.ClusterNodes(ctx).Result()
		if err == nil && strings.Contains(nodes, id) && rc.ClusterReplicate(ctx, id).Err() == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the second node never learned the first: %v %s", err, nodes)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for {
		info, err := pc.ClusterInfo(ctx).Result()
		nodes, _ := pc.ClusterNodes(ctx).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(nodes, "slave") {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the cluster never became ok with a replica: %v %s %s", err, info, nodes)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{primary.Addr}})
	t.Cleanup(func() { _ = cc.Close() })
	s, err := New(cc)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); !errors.Is(err, ErrNotDurable) {
		t.Fatalf("Check on a cluster with a replica = %v, want ErrNotDurable", err)
	}
	s, err = New(cc, AllowLosingAcknowledgedWrites())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, failoverKey, ownerToken, "owner"); err != nil {
		t.Fatalf("a claim on a cluster with a replica, AllowLosingAcknowledgedWrites given: %v", err)
	}
}

// TestFailoverChecksTheNewPrimary: after a failover the client reaches another server (as a
// Sentinel failover client does), whose settings the store never read. A fence write there
// is not acknowledged until they pass the check: a promoted replica with appendfsync
// everysec loses acknowledged advances on a crash, as the former primary would have.
func TestFailoverChecksTheNewPrimary(t *testing.T) {
	rs := startReplicated(t)
	ctx := testenv.Context(t, 20*time.Second)
	if err := rs.rc.ConfigSet(ctx, "appendfsync", "everysec").Err(); err != nil {
		t.Fatal(err)
	}
	var addr atomic.Value
	addr.Store(rs.primary.Addr)
	c := redis.NewClient(&redis.Options{Addr: rs.primary.Addr, DisableIdentity: true,
		Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr.Load().(string))
		}})
	t.Cleanup(func() { _ = c.Close() })
	s, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, failoverKey, zombieToken, "zombie"); err != nil {
		t.Fatal(err)
	}
	rs.primary.Kill()
	if err := rs.rc.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	addr.Store(rs.replica.Addr)
	err = untilReplicated(testenv.Context(t, 5*time.Second), func() error {
		_, err := s.Claim(ctx, failoverKey, ownerToken, "owner")
		if err != nil && strings.Contains(err.Error(), "appendfsync everysec") {
			return nil
		}
		return err
	})
	if err != nil {
		t.Fatalf("the owner's claim on the promoted replica = %v, want ErrNotDurable naming appendfsync everysec", err)
	}
}
