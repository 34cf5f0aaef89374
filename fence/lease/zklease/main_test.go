package zklease_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/goleak"

	"github.com/batonhq/baton/fence/lease"
	"github.com/batonhq/baton/fence/lease/zklease"
	"github.com/batonhq/baton/internal/testkit/leasetest"
)

// envZooKeeper names the ZooKeeper the tests use; deploy/local/zookeeper.sh env prints it.
const envZooKeeper = "BATON_ZOOKEEPER_ADDR"

// testTimeout is the session timeout of the tests' leases (the local server allows 1s-60s).
const testTimeout = 2 * time.Second

func TestMain(m *testing.M) {
	if leasetest.IsChild() {
		os.Exit(leasetest.Child(leasetest.Config{NewSource: func(ctx context.Context) (lease.Source, func(), error) {
			src, err := zklease.New(strings.Split(os.Getenv(envZooKeeper), ","), zklease.SessionTimeout(testTimeout))
			return src, func() {}, err
		}}))
	}
	goleak.VerifyTestMain(m)
}

// servers returns the configured ZooKeeper, or skips (fails in CI) saying how to start one.
func servers(t testing.TB) []string {
	t.Helper()
	v := os.Getenv(envZooKeeper)
	if v == "" {
		const hint = "start it with 'deploy/local/zookeeper.sh start' and export what 'deploy/local/zookeeper.sh env' prints (or run 'make test')"
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set: CI must provide a real ZooKeeper (%s)", envZooKeeper, hint)
		}
		t.Skipf("%s is not set: %s", envZooKeeper, hint)
	}
	return strings.Split(v, ",")
}

type quiet struct{}

func (quiet) Printf(string, ...any) {}

// conn opens a plain client session for the test's own checks, closed (and its goroutines
// gone) at cleanup.
func conn(t testing.TB, srv []string) *zk.Conn {
	t.Helper()
	c, events, err := zk.Connect(srv, 5*time.Second, zk.WithLogger(quiet{}), zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		for range events {
		}
	})
	return c
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
