package zklease_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/lease"
	"github.com/batonhq/baton/fence/lease/zklease"
	"github.com/batonhq/baton/internal/testkit/leasetest"
)

func TestNewRejectsAllProblems(t *testing.T) {
	_, err := zklease.New(nil, zklease.SessionTimeout(0), nil, zklease.Root("x/"), zklease.Era(-1), zklease.Group(""), zklease.ACL())
	if !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("New = %v, want ErrInvalid", err)
	}
	for _, want := range []string{"no servers", "session timeout", "option 1 is nil", "root", "era", "group", "ACL"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("New error %q does not mention %q", err, want)
		}
	}
}

func newSource(t testing.TB, srv []string) *zklease.Source {
	t.Helper()
	src, err := zklease.New(srv, zklease.SessionTimeout(testTimeout))
	if err != nil {
		t.Fatal(err)
	}
	return src
}

func TestAcquireReleaseOrder(t *testing.T) {
	src := newSource(t, servers(t))
	ctx := ctxT(t, 20*time.Second)
	res := fmt.Sprintf("order/%d", time.Now().UnixNano()) // a slash is escaped, not a sub-resource
	if _, err := src.Acquire(ctx, ""); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("Acquire(\"\") = %v, want ErrInvalid", err)
	}
	a, err := src.Acquire(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	if a.Key() != lease.Key("lease:zookeeper", res) || a.Token().Epoch <= 0 {
		t.Fatalf("lease key %v token %s", a.Key(), a.Token())
	}
	got := make(chan *lease.Lease, 1)
	go func() {
		b, err := src.Acquire(ctx, res)
		if err != nil {
			t.Error(err)
		}
		got <- b
	}()
	select {
	case <-got:
		t.Fatal("a second holder acquired while the first held the lease")
	case <-time.After(300 * time.Millisecond):
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var b *lease.Lease
	select {
	case b = <-got:
	case <-ctx.Done():
		t.Fatal("the waiter did not acquire after the release")
	}
	if b == nil {
		t.FailNow()
	}
	defer b.Release(ctx)
	if a.Token().Compare(b.Token()) >= 0 {
		t.Fatalf("second token %s not above first %s", b.Token(), a.Token())
	}
}

// deleteNode ends a grant from outside: what a session expiry does to the node.
func deleteNode(c *zk.Conn) func(ctx context.Context, id string) error {
	return func(_ context.Context, id string) error { return c.Delete(id, -1) }
}

func TestLostWhenNodeDeleted(t *testing.T) {
	srv := servers(t)
	src := newSource(t, srv)
	ctx := ctxT(t, 10*time.Second)
	l, err := src.Acquire(ctx, fmt.Sprintf("delete-%d", time.Now().UnixNano()))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if err := deleteNode(conn(t, srv))(ctx, l.ID()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Context().Done():
	case <-ctx.Done():
		t.Fatal("lease context still alive after its node was deleted")
	}
	if !errors.Is(context.Cause(l.Context()), lease.ErrLost) {
		t.Fatalf("Err = %v, want ErrLost", context.Cause(l.Context()))
	}
}

func TestZombie(t *testing.T) {
	servers(t)
	leasetest.Zombie(t, "lease:zookeeper")
}

func TestInFlight(t *testing.T) {
	leasetest.InFlight(t, "lease:zookeeper", deleteNode(conn(t, servers(t))))
}

// TestRestart stops and restarts a private ZooKeeper (deploy/local/zookeeper.sh with its own
// directory and port): while it is down Acquire fails with the cause and the held lease ends
// after the session timeout; after the restart Acquire works again and its token (a czxid) is
// above every earlier one, since zxids are on disk.
func TestRestart(t *testing.T) {
	servers(t) // the shared server being configured says zookeeper.sh can fetch and run one
	script := deployScript(t, "zookeeper.sh")
	port := freePort(t)
	env := append(os.Environ(), "ZOOKEEPER_DIR="+t.TempDir(), "ZOOKEEPER_PORT="+port)
	run := func(cmd string) {
		t.Helper()
		c := exec.Command(script, cmd)
		c.Env = env
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("zookeeper.sh %s: %v\n%s", cmd, err, out)
		}
	}
	run("start")
	t.Cleanup(func() { run("stop") })
	src := newSource(t, []string{"127.0.0.1:" + port})
	ctx := ctxT(t, 60*time.Second)
	first, err := src.Acquire(ctx, "restart")
	if err != nil {
		t.Fatal(err)
	}
	defer first.Release(ctx)

	run("stop")
	down, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = src.Acquire(down, "other")
	cancel()
	if err == nil || !strings.Contains(err.Error(), "no session with") || !strings.Contains(err.Error(), "connect") {
		t.Fatalf("Acquire while ZooKeeper is down = %v, want the connection error", err)
	}
	t.Logf("while down: %v", err)
	select {
	case <-first.Context().Done():
		t.Logf("held lease ended: %v", context.Cause(first.Context()))
	case <-time.After(3 * testTimeout):
		t.Fatal("the held lease's context did not end while ZooKeeper was down")
	}

	run("start")
	again, err := src.Acquire(ctxT(t, 20*time.Second), "restart")
	if err != nil {
		t.Fatalf("Acquire after the restart: %v", err)
	}
	defer again.Release(ctx)
	if first.Token().Compare(again.Token()) >= 0 {
		t.Fatalf("token after restart %s not above %s", again.Token(), first.Token())
	}
}

func deployScript(t *testing.T, name string) string {
	t.Helper()
	// go test runs a package's tests in its directory (also in a binary built with -trimpath,
	// where the source file's own path is not absolute).
	p, err := filepath.Abs(filepath.Join("..", "..", "..", "deploy", "local", name))
	if err != nil {
		t.Fatalf("deploy script: %v", err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("deploy script: %v", err)
	}
	return p
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

func BenchmarkAcquireRelease(b *testing.B) {
	src := newSource(b, servers(b))
	ctx := ctxT(b, 5*time.Minute)
	res := fmt.Sprintf("bench-%d", time.Now().UnixNano())
	for b.Loop() {
		l, err := src.Acquire(ctx, res)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// The token's epoch is the czxid of the holder's node: the zxid of the transaction that
// created it, unique and increasing across the ensemble. A per-node counter (the node's data
// version, its sequence number) starts again for every node, so two holders one after the
// other would carry equal tokens and the fence could not tell the later from the deposed one.
func TestTokenIsTheNodeCzxid(t *testing.T) {
	srv := servers(t)
	src := newSource(t, srv)
	ctx := ctxT(t, 20*time.Second)
	c := conn(t, srv)
	res := fmt.Sprintf("czxid-%d", time.Now().UnixNano())
	var prev fence.Token
	for i := range 2 {
		l, err := src.Acquire(ctx, res)
		if err != nil {
			t.Fatal(err)
		}
		exists, stat, err := c.Exists(l.ID())
		if err != nil || !exists {
			t.Fatalf("the holder's node %s: exists %v, %v", l.ID(), exists, err)
		}
		if l.Token().Epoch != stat.Czxid {
			t.Fatalf("holder %d's token %s: its epoch is not its node's czxid %d (data version %d)", i, l.Token(), stat.Czxid, stat.Version)
		}
		if i > 0 && prev.Compare(l.Token()) >= 0 {
			t.Fatalf("holder %d's token %s not above its predecessor's %s", i, l.Token(), prev)
		}
		prev = l.Token()
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
