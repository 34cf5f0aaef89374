package pgfence

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/fencetest"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// secureStore makes the test's schema on the TLS-only PostgreSQL: the migration role creates
// the store's tables and a user table and grants the runtime role what RuntimeGrants lists; the
// returned store works through the runtime role's pool (sslmode=verify-full).
func secureStore(t testing.TB) (*Store, *testenv.SecurePG) {
	t.Helper()
	sp := testenv.SecurePostgres(t)
	ctx := testenv.Context(t, time.Minute)
	admin, err := New(sp.Admin)
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sp.Admin.Exec(ctx, `CREATE TABLE kv (k text PRIMARY KEY, v text NOT NULL CHECK (v <> 'fail'))`); err != nil {
		t.Fatal(err)
	}
	grants, err := admin.RuntimeGrants(sp.RuntimeRole)
	if err != nil {
		t.Fatal(err)
	}
	sp.Grant(t, append(grants, "GRANT SELECT, INSERT, UPDATE ON kv TO "+sp.RuntimeRole))
	s, err := New(sp.Runtime)
	if err != nil {
		t.Fatal(err)
	}
	return s, sp
}

// TestSecureConformanceRuntimeRole runs the whole fence conformance suite as the least-privilege
// runtime role over TLS (verify-full, scram-sha-256): RuntimeGrants are all the store needs.
func TestSecureConformanceRuntimeRole(t *testing.T) {
	fencetest.Run(t, func(t *testing.T) fencetest.Env[pgx.Tx] {
		s, sp := secureStore(t)
		return secureEnv(t, s, sp.Runtime, sp)
	})
}

func secureEnv(t testing.TB, s *Store, pool *pgxpool.Pool, sp *testenv.SecurePG) fencetest.Env[pgx.Tx] {
	env := conformanceEnv(t, s, pool, sp.Schema)
	env.Reopen = func(t testing.TB) fencetest.Env[pgx.Tx] {
		pool.Close()
		cfg, err := pgxpool.ParseConfig(sp.RuntimeURL)
		if err != nil {
			t.Fatal(err)
		}
		p, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		s2, err := New(p)
		if err != nil {
			t.Fatal(err)
		}
		return secureEnv(t, s2, p, sp)
	}
	return env
}

// TestSecureRuntimeRoleCannotChangeTheFence: the runtime role can use the fence but cannot
// alter, drop, truncate or delete from it, nor create a table: what a stolen runtime
// credential cannot do (SECURITY.md).
func TestSecureRuntimeRoleCannotChangeTheFence(t *testing.T) {
	t.Parallel()
	s, sp := secureStore(t)
	ctx := testenv.Context(t, time.Minute)
	k := fence.Key{Group: "g", Topic: "t", Partition: 0}
	if _, err := s.Claim(ctx, k, fence.Token{Epoch: 1}, "test"); err != nil {
		t.Fatalf("claim as the runtime role: %v", err)
	}
	for _, q := range []string{
		`ALTER TABLE baton_fences ADD COLUMN x int`,
		`ALTER TABLE baton_fences DROP CONSTRAINT baton_fences_pkey`,
		`DROP TABLE baton_fences`,
		`TRUNCATE baton_fences`,
		`DELETE FROM baton_fences`,
		`DELETE FROM baton_fences_recoveries`,
		`UPDATE baton_fences_recoveries SET reason = 'x'`,
		`CREATE TABLE mine (i int)`,
		`CREATE TEMP TABLE mine (i int)`,
	} {
		_, err := sp.Runtime.Exec(ctx, q)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || (pe.Code != "42501" && !strings.Contains(pe.Message, "must be owner")) {
			t.Errorf("%s as the runtime role: %v, want a permission error (42501)", q, err)
		}
	}
	var era, epoch int64
	if err := sp.Admin.QueryRow(ctx, `SELECT era, epoch FROM baton_fences`).Scan(&era, &epoch); err != nil || epoch != 1 {
		t.Fatalf("the fence row after the refused statements: %d.%d, %v", era, epoch, err)
	}
}

func TestRuntimeGrants(t *testing.T) {
	s, err := New(&pgxpool.Pool{}, Table("app.fences"))
	if err != nil {
		t.Fatal(err)
	}
	g, err := s.RuntimeGrants("baton_runtime")
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(g, ";\n")
	for _, want := range []string{`GRANT USAGE ON SCHEMA "app" TO "baton_runtime"`,
		`GRANT SELECT, INSERT, UPDATE ON TABLE "app"."fences" TO "baton_runtime"`,
		`GRANT SELECT, INSERT ON TABLE "app"."fences_recoveries" TO "baton_runtime"`,
		`GRANT SELECT, INSERT, UPDATE ON TABLE "app"."fences_keyed" TO "baton_runtime"`} {
		if !strings.Contains(all, want) {
			t.Errorf("grants lack %s:\n%s", want, all)
		}
	}
	for _, bad := range []string{"TRUNCATE", "DELETE", "ALL", "CREATE", "ALTER"} {
		if strings.Contains(all, bad) {
			t.Errorf("grants hold %s:\n%s", bad, all)
		}
	}
	for _, role := range []string{"", "a.b", `x"; DROP TABLE t; --`} {
		if _, err := s.RuntimeGrants(role); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("RuntimeGrants(%q) = %v, want ErrInvalid", role, err)
		}
	}
}
