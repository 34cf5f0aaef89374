package shard

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var names3 = []string{"a", "b", "c"}

const kvSchema = `CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v TEXT NOT NULL CHECK (v <> 'fail'))`

// liteShards opens an SQLite file per name, each with the fence tables and a kv table, and
// publishes placement version 1 (the rule over names, no entries) in the first one, the home.
func liteShards(t testing.TB, names ...string) (map[string]Shard[*sql.Tx], map[string]*sqlitefence.Store, Placements) {
	t.Helper()
	dir := t.TempDir()
	shards := map[string]Shard[*sql.Tx]{}
	stores := map[string]*sqlitefence.Store{}
	for _, n := range names {
		s, err := sqlitefence.Open(filepath.Join(dir, n+".db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if _, err := s.DB().Exec(kvSchema); err != nil {
			t.Fatal(err)
		}
		shards[n], stores[n] = s, s
	}
	pl := SQLite(stores[names[0]].DB())
	publishFirst(t, pl, names)
	return shards, stores, pl
}

// pgShards makes a schema per name, each with the fence tables and a kv table, and publishes
// placement version 1 in the first one, the home. The schemas are on the clusters of
// BATON_POSTGRES_SHARD_URLS, one each, when it is set (deploy/local: BATON_PG_SHARDS=3 make
// up), else all on the server of BATON_POSTGRES_URL.
func pgShards(t *testing.T, names ...string) (map[string]Shard[pgx.Tx], map[string]*pgxpool.Pool, Placements) {
	t.Helper()
	var urls []string
	if v := os.Getenv("BATON_POSTGRES_SHARD_URLS"); v != "" {
		urls = strings.Split(v, ",")
		if len(urls) < len(names) {
			t.Fatalf("BATON_POSTGRES_SHARD_URLS names %d clusters, want %d", len(urls), len(names))
		}
	}
	shards := map[string]Shard[pgx.Tx]{}
	pools := map[string]*pgxpool.Pool{}
	for i, n := range names {
		var pool *pgxpool.Pool
		if urls != nil {
			pool = schemaOn(t, urls[i])
		} else {
			pool, _ = testenv.Postgres(t)
		}
		shards[n] = pgStore(t, pool)
		pools[n] = pool
	}
	pl := Postgres(pools[names[0]])
	publishFirst(t, pl, names)
	return shards, pools, pl
}

func pgStore(t testing.TB, pool *pgxpool.Pool) *pgfence.Store {
	t.Helper()
	s, err := pgfence.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), kvSchema); err != nil {
		t.Fatal(err)
	}
	return s
}

func publishFirst(t testing.TB, pl Placements, names []string) {
	t.Helper()
	if err := pl.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := pl.Publish(t.Context(), Placement{Version: 1, Shards: names}, "three shards"); err != nil {
		t.Fatal(err)
	}
}

func newRouter[Tx any](t testing.TB, shards map[string]Shard[Tx], pl Placements) Router[Tx] {
	t.Helper()
	r, err := New(t.Context(), names3[0], shards, pl)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func writeLite(ctx context.Context, tx *sql.Tx, k, v string) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO kv (k, v) VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v`, k, v)
	return err
}

func writePG(ctx context.Context, tx pgx.Tx, k, v string) error {
	_, err := tx.Exec(ctx, `INSERT INTO kv (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = excluded.v`, k, v)
	return err
}

// countLite returns how many kv rows shard holds.
func countLite(t testing.TB, s *sqlitefence.Store) int {
	t.Helper()
	var n int
	if err := s.DB().QueryRow(`SELECT count(*) FROM kv`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// keyOn returns a key of group g and topic "t" that the rule of p places on shard name.
func keyOn(t testing.TB, p Placement, g, name string) fence.Key {
	t.Helper()
	for i := int32(0); i < 64; i++ {
		k := fence.Key{Group: g, Topic: "t", Partition: i}
		if p.Shard(k) == name {
			return k
		}
	}
	t.Fatalf("no key of %s placed on %s", g, name)
	return fence.Key{}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func wantIs(t testing.TB, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got %v, want %v", what, err, target)
	}
}

// schemaOn makes a fresh schema on the cluster at url and returns a pool using it; both are
// removed when t ends.
func schemaOn(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect to a cluster of BATON_POSTGRES_SHARD_URLS: %v", err)
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
