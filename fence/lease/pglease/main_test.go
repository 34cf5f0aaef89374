package pglease_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/batonhq/baton/fence/lease"
	"github.com/batonhq/baton/fence/lease/pglease"
	"github.com/batonhq/baton/internal/testkit/leasetest"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// testTTL is the TTL of the tests' leases.
const testTTL = 2 * time.Second

func TestMain(m *testing.M) {
	if leasetest.IsChild() {
		os.Exit(leasetest.Child(leasetest.Config{NewSource: func(ctx context.Context) (lease.Source, func(), error) {
			cc, err := pgx.ParseConfig(os.Getenv(testenv.EnvPostgres))
			if err != nil {
				return nil, nil, err
			}
			src, err := pglease.New(cc, pglease.TTL(testTTL))
			if err != nil {
				return nil, nil, err
			}
			return src, func() {}, src.Migrate(ctx)
		}}))
	}
	goleak.VerifyTestMain(m)
}

// newSource returns a migrated source on url.
func newSource(t testing.TB, url string) *pglease.Source {
	t.Helper()
	cc, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	src, err := pglease.New(cc, pglease.TTL(testTTL))
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Migrate(ctxT(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	return src
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
