package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Environment variables naming the real services. deploy/local/{kafka,postgres}.sh env print them.
const (
	EnvKafka    = "BATON_KAFKA_BROKERS" // comma-separated host:port list, e.g. 127.0.0.1:19092
	EnvPostgres = "BATON_POSTGRES_URL"  // e.g. postgres://baton:baton@127.0.0.1:15432/baton
	EnvRedis    = "BATON_REDIS_ADDR"    // host:port, e.g. 127.0.0.1:16379
)

const startHint = "start the services with 'make up' and export what 'make env' prints (or run 'make test')"

// missing skips the test, or fails it in CI, explaining which service is missing and how to start it.
func missing(t testing.TB, env string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("%s is not set: CI must provide the real service (%s)", env, startHint)
	}
	t.Skipf("%s is not set: %s", env, startHint)
}

// UniqueName returns prefix plus random hex, safe as a topic, group or schema name.
func UniqueName(prefix string) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux; this is test-only code
	}
	return prefix + "_" + hex.EncodeToString(b[:])
}

// KafkaBrokers returns the real broker's addresses, or skips/fails when none is configured.
func KafkaBrokers(t testing.TB) []string {
	t.Helper()
	v := os.Getenv(EnvKafka)
	if v == "" {
		missing(t, EnvKafka)
	}
	return strings.Split(v, ",")
}

// FakeKafka starts an in-process kfake cluster for the test and stops it at cleanup.
func FakeKafka(t testing.TB, opts ...kfake.Opt) []string {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

// NewTopic creates a topic with a unique name and the given partition count on brokers and
// deletes it when the test ends.
func NewTopic(t testing.TB, brokers []string, partitions int32) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	name := UniqueName("t")
	resp, err := adm.CreateTopic(ctx, partitions, 1, nil, name)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create topic %s on %v: %v", name, brokers, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
		if err != nil {
			return
		}
		defer cl.Close()
		_, _ = kadm.NewClient(cl).DeleteTopics(ctx, name)
	})
	return name
}

// PostgresURL returns the configured database URL, or skips/fails when none is configured.
func PostgresURL(t testing.TB) string {
	t.Helper()
	v := os.Getenv(EnvPostgres)
	if v == "" {
		missing(t, EnvPostgres)
	}
	return v
}

// RedisAddr returns the real Redis server's address, or skips/fails when none is configured.
func RedisAddr(t testing.TB) string {
	t.Helper()
	v := os.Getenv(EnvRedis)
	if v == "" {
		missing(t, EnvRedis)
	}
	return v
}

// Postgres creates a fresh schema for the test and returns a pool whose connections use it as
// their search_path; the schema is dropped when the test ends. The schema name is returned too.
func Postgres(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	url := PostgresURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	schema := UniqueName("test")
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", EnvPostgres, err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("parse %s: %v", EnvPostgres, err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Logf("drop schema %s: %v", schema, err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Logf("drop schema %s: %v", schema, err)
		}
	})
	return pool, schema
}

// Context returns a context cancelled when the test ends or after d, whichever is first.
func Context(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
