package etcdlease_test

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

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/lease"
	"github.com/batonhq/baton/fence/lease/etcdlease"
	"github.com/batonhq/baton/internal/testkit/leasetest"
)

func TestNewRejectsAllProblems(t *testing.T) {
	_, err := etcdlease.New(nil, etcdlease.TTL(time.Millisecond), nil, etcdlease.Prefix("x"), etcdlease.Era(-1), etcdlease.Group(""))
	if !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("New = %v, want ErrInvalid", err)
	}
	for _, want := range []string{"nil client", "TTL", "option 1 is nil", "prefix", "era", "group"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("New error %q does not mention %q", err, want)
		}
	}
}

func TestAcquireReleaseOrder(t *testing.T) {
	cl := client(t, endpoints(t))
	src, err := etcdlease.New(cl, etcdlease.TTL(testTTL))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 20*time.Second)
	res := fmt.Sprintf("order/%d", time.Now().UnixNano()) // a slash is escaped, not a sub-resource
	if _, err := src.Acquire(ctx, ""); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("Acquire(\"\") = %v, want ErrInvalid", err)
	}
	a, err := src.Acquire(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	if a.Key() != lease.Key("lease:etcd", res) || a.Token().Epoch <= 0 {
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
	if !errors.Is(context.Cause(a.Context()), lease.ErrReleased) {
		t.Fatalf("released lease Err = %v", context.Cause(a.Context()))
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

func TestLostWhenRevoked(t *testing.T) {
	cl := client(t, endpoints(t))
	src, err := etcdlease.New(cl, etcdlease.TTL(testTTL))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 10*time.Second)
	l, err := src.Acquire(ctx, fmt.Sprintf("revoke-%d", time.Now().UnixNano()))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if err := revoke(cl)(ctx, l.ID()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Context().Done():
	case <-ctx.Done():
		t.Fatal("lease context still alive after its etcd lease was revoked")
	}
	if !errors.Is(context.Cause(l.Context()), lease.ErrLost) {
		t.Fatalf("Err = %v, want ErrLost", context.Cause(l.Context()))
	}
}

// revoke ends a grant from outside: what an operator or the TTL does.
func revoke(cl *clientv3.Client) func(ctx context.Context, id string) error {
	return func(ctx context.Context, id string) error {
		n, err := strconv.ParseInt(id, 16, 64)
		if err != nil {
			return err
		}
		_, err = cl.Revoke(ctx, clientv3.LeaseID(n))
		return err
	}
}

func TestZombie(t *testing.T) {
	endpoints(t)
	leasetest.Zombie(t, "lease:etcd")
}

func TestInFlight(t *testing.T) {
	leasetest.InFlight(t, "lease:etcd", revoke(client(t, endpoints(t))))
}

// TestRestart stops and restarts a private etcd (deploy/local/etcd.sh with its own directory
// and ports): while it is down Acquire fails with the cause and the held lease ends; after the
// restart Acquire works again and its token is above every earlier one (revisions are on disk).
func TestRestart(t *testing.T) {
	endpoints(t) // the shared etcd being configured says etcd.sh can install and run one
	script := deployScript(t, "etcd.sh")
	port, peer := freePort(t), freePort(t)
	env := append(os.Environ(), "ETCD_DIR="+t.TempDir(), "ETCD_PORT="+port, "ETCD_PEER_PORT="+peer)
	run := func(cmd string) {
		t.Helper()
		c := exec.Command(script, cmd)
		c.Env = env
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("etcd.sh %s: %v\n%s", cmd, err, out)
		}
	}
	run("start")
	t.Cleanup(func() { run("stop") })
	cl := client(t, []string{"127.0.0.1:" + port})
	src, err := etcdlease.New(cl, etcdlease.TTL(testTTL))
	if err != nil {
		t.Fatal(err)
	}
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
	if err == nil || !strings.Contains(err.Error(), "grant a lease from") {
		t.Fatalf("Acquire while etcd is down = %v, want a grant error", err)
	}
	t.Logf("while down: %v", err)
	select {
	case <-first.Context().Done():
		t.Logf("held lease ended: %v", context.Cause(first.Context()))
	case <-time.After(3 * testTTL):
		t.Fatal("the held lease's context did not end while etcd was down")
	}

	run("start")
	var again *lease.Lease
	for again == nil { // the client reconnects with backoff
		a, err := src.Acquire(ctxT(t, 5*time.Second), "restart")
		switch {
		case err == nil:
			again = a
		case ctx.Err() != nil:
			t.Fatalf("Acquire after the restart: %v", err)
		}
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
	cl := client(b, endpoints(b))
	src, err := etcdlease.New(cl, etcdlease.TTL(testTTL))
	if err != nil {
		b.Fatal(err)
	}
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
