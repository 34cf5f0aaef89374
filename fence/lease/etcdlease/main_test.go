package etcdlease_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/batonhq/baton/fence/lease"
	"github.com/batonhq/baton/fence/lease/etcdlease"
	"github.com/batonhq/baton/internal/testkit/leasetest"
)

// envEtcd names the etcd the tests use; deploy/local/etcd.sh env prints it.
const envEtcd = "BATON_ETCD_ENDPOINTS"

// testTTL is the TTL of the tests' leases: etcd's minimum with default timings.
const testTTL = 2 * time.Second

func TestMain(m *testing.M) {
	if leasetest.IsChild() {
		os.Exit(leasetest.Child(leasetest.Config{NewSource: func(ctx context.Context) (lease.Source, func(), error) {
			cl, err := newClient(strings.Split(os.Getenv(envEtcd), ","))
			if err != nil {
				return nil, nil, err
			}
			src, err := etcdlease.New(cl, etcdlease.TTL(testTTL))
			if err != nil {
				_ = cl.Close()
				return nil, nil, err
			}
			return src, func() { _ = cl.Close() }, nil
		}}))
	}
	goleak.VerifyTestMain(m)
}

func newClient(endpoints []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 2 * time.Second,
		Logger:      zap.NewNop(),
	})
}

// endpoints returns the configured etcd, or skips (fails in CI) saying how to start one.
func endpoints(t testing.TB) []string {
	t.Helper()
	v := os.Getenv(envEtcd)
	if v == "" {
		const hint = "start it with 'deploy/local/etcd.sh start' and export what 'deploy/local/etcd.sh env' prints (or run 'make test')"
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set: CI must provide a real etcd (%s)", envEtcd, hint)
		}
		t.Skipf("%s is not set: %s", envEtcd, hint)
	}
	return strings.Split(v, ",")
}

func client(t testing.TB, eps []string) *clientv3.Client {
	t.Helper()
	cl, err := newClient(eps)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
