package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The real services the tests use, named by the variables deploy/local/env.sh prints. Without
// one a test is skipped; in CI (CI set) it fails instead.

func service(t *testing.T, name, hint string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set: CI must run this test (%s)", name, hint)
		}
		t.Skipf("%s is not set (%s)", name, hint)
	}
	return v
}

func kafkaBrokers(t *testing.T) []string {
	return strings.Split(service(t, "BATON_KAFKA_BROKERS", "'make up' starts a broker"), ",")
}

func postgresURL(t *testing.T) string {
	return service(t, "BATON_POSTGRES_URL", "'make up' starts PostgreSQL")
}

// uniqueName is a name no other test run uses.
func uniqueName(prefix string) string { return fmt.Sprintf("%s_%x", prefix, time.Now().UnixNano()) }

// withSearchPath is url with its connections' search_path set to schema.
func withSearchPath(url, schema string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "search_path=" + schema
}

// freshSchema creates a schema of the test's own through adminURL (dropped when the test
// ends), runs grant (if not "") in it, and returns its name.
func freshSchema(t *testing.T, adminURL string, grant func(schema string) string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	schema := uniqueName("test")
	s := pgx.Identifier{schema}.Sanitize()
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	stmt := "CREATE SCHEMA " + s
	if grant != nil {
		stmt += "; " + grant(s)
	}
	if _, err := conn.Exec(ctx, stmt); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, adminURL); err == nil {
			_, _ = c.Exec(ctx, "DROP SCHEMA "+s+" CASCADE")
			_ = c.Close(ctx)
		}
	})
	return schema
}

// pool opens a pool on url (closed when the test ends).
func pool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}
