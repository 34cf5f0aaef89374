package shard

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/batonhq/baton/fence/fencetest"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// shardURLs returns the PostgreSQL clusters of BATON_POSTGRES_SHARD_URLS (deploy/local:
// BATON_PG_SHARDS=3 make up), or skips saying how to start them.
func shardURLs(t *testing.T) []string {
	v := os.Getenv("BATON_POSTGRES_SHARD_URLS")
	if v == "" {
		t.Skip("BATON_POSTGRES_SHARD_URLS is not set: start three clusters with BATON_PG_SHARDS=3 make up, then eval \"$(BATON_PG_SHARDS=3 make -s env)\" (the three-shard tests on one cluster run without it)")
	}
	urls := strings.Split(v, ",")
	if len(urls) < 3 {
		t.Fatalf("BATON_POSTGRES_SHARD_URLS names %d clusters, want 3", len(urls))
	}
	return urls[:3]
}

// schemaOn makes a fresh schema on the cluster at url and returns a pool using it; both are
// removed when t ends.
func schemaOn(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	schema := testenv.UniqueName("shard")
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = admin.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		_ = admin.Close(ctx)
	})
	return pool
}

// TestConformanceInstances runs the suite over a router of three PostgreSQL clusters, one
// shard each.
func TestConformanceInstances(t *testing.T) {
	urls := shardURLs(t)
	fencetest.Run(t, func(t *testing.T) fencetest.Env[pgx.Tx] {
		shards := map[string]Shard[pgx.Tx]{}
		pools := map[string]*pgxpool.Pool{}
		for i, n := range names3 {
			pools[n] = schemaOn(t, urls[i])
			shards[n] = pgStore(t, pools[n])
		}
		pl := Postgres(pools["a"])
		publishFirst(t, pl, names3)
		r := newRouter(t, shards, pl)
		return fencetest.Env[pgx.Tx]{
			Sink: r, Write: writePG,
			Read: func(ctx context.Context, k string) (string, bool, error) {
				for _, n := range names3 {
					var v string
					err := pools[n].QueryRow(ctx, `SELECT v FROM kv WHERE k = $1`, k).Scan(&v)
					if err == nil {
						return v, true, nil
					}
					if !errors.Is(err, pgx.ErrNoRows) {
						return "", false, err
					}
				}
				return "", false, nil
			},
		}
	})
}
