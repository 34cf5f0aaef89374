package pgfence

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/batonhq/baton/fence/fencetest"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

func TestConformance(t *testing.T) {
	fencetest.Run(t, func(t *testing.T) fencetest.Env[pgx.Tx] {
		pool, schema := testenv.Postgres(t)
		ctx := testenv.Context(t, time.Minute)
		s, err := New(pool)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `CREATE TABLE kv (k text PRIMARY KEY, v text NOT NULL CHECK (v <> 'fail'))`); err != nil {
			t.Fatal(err)
		}
		return conformanceEnv(t, s, pool, schema)
	})
}

func conformanceEnv(t testing.TB, s *Store, pool *pgxpool.Pool, schema string) fencetest.Env[pgx.Tx] {
	return fencetest.Env[pgx.Tx]{
		Sink:  s,
		Keyed: s,
		Write: writeKV,
		Read: func(ctx context.Context, k string) (string, bool, error) {
			var v string
			err := pool.QueryRow(ctx, `SELECT v FROM kv WHERE k = $1`, k).Scan(&v)
			if errors.Is(err, pgx.ErrNoRows) {
				return "", false, nil
			}
			return v, err == nil, err
		},
		Reopen: func(t testing.TB) fencetest.Env[pgx.Tx] {
			// A new pool on the same schema: nothing survives but what the database holds.
			pool.Close()
			cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
			if err != nil {
				t.Fatal(err)
			}
			cfg.ConnConfig.RuntimeParams["search_path"] = schema
			p, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Close)
			s2, err := New(p)
			if err != nil {
				t.Fatal(err)
			}
			return conformanceEnv(t, s2, p, schema)
		},
		Table: func(name string) error {
			_, err := New(pool, Table(name))
			return err
		},
		Begin: func(ctx context.Context) (pgx.Tx, func() error, func() error, error) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return nil, nil, nil, err
			}
			rollback := func() error {
				// Not ctx: the suite rolls back in t.Cleanup, after the case's context ended.
				rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				return tx.Rollback(rctx)
			}
			return tx, func() error { return tx.Commit(ctx) }, rollback, nil
		},
	}
}
