package leasetest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/lease"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/fence/sqlitefence"
)

// envPostgres is read by the suite to choose PostgreSQL; it is what deploy/local/postgres.sh
// env prints.
const envPostgres = "BATON_POSTGRES_URL"

// target is the fenced sink the holders write to, with the caller's table lease_data.
type target interface {
	apply(ctx context.Context, l *lease.Lease, pos int64, value string, during func(ctx context.Context)) error
	raw(ctx context.Context, k fence.Key, t fence.Token, pos int64, value string) error
	claim(ctx context.Context, l *lease.Lease) (fence.State, error)
	value(ctx context.Context, resource string) (string, error)
	load(ctx context.Context, k fence.Key) (fence.State, error)
	close()
}

type sinkTarget[Tx any] struct {
	s       fence.Sink[Tx]
	put     func(ctx context.Context, tx Tx, resource, value string) error
	get     func(ctx context.Context, resource string) (string, error)
	closeFn func()
}

func (g *sinkTarget[Tx]) write(resource, value string, during func(context.Context)) func(context.Context, Tx) error {
	return func(ctx context.Context, tx Tx) error {
		if err := g.put(ctx, tx, resource, value); err != nil {
			return err
		}
		if during != nil {
			during(ctx)
		}
		return nil
	}
}

type anyTarget[Tx any] struct{ *sinkTarget[Tx] }

func (g anyTarget[Tx]) apply(ctx context.Context, l *lease.Lease, pos int64, value string, during func(context.Context)) error {
	return lease.Apply(ctx, g.s, l, pos, g.write(l.Key().Topic, value, during))
}
func (g anyTarget[Tx]) raw(ctx context.Context, k fence.Key, t fence.Token, pos int64, value string) error {
	return g.s.Apply(ctx, k, t, pos, pos, g.write(k.Topic, value, nil))
}
func (g anyTarget[Tx]) claim(ctx context.Context, l *lease.Lease) (fence.State, error) {
	return lease.Claim(ctx, g.s, l)
}
func (g anyTarget[Tx]) value(ctx context.Context, resource string) (string, error) {
	return g.get(ctx, resource)
}
func (g anyTarget[Tx]) load(ctx context.Context, k fence.Key) (fence.State, error) {
	return g.s.Load(ctx, k)
}
func (g anyTarget[Tx]) close() { g.closeFn() }

// openTarget opens the sink named by the helper's environment.
func openTarget(ctx context.Context, pgSchema, sqlitePath string) (target, error) {
	if pgSchema != "" {
		return openPostgres(ctx, os.Getenv(envPostgres), pgSchema)
	}
	return openSQLite(sqlitePath)
}

const pgData = `CREATE TABLE IF NOT EXISTS lease_data (resource text PRIMARY KEY, value text NOT NULL)`

func openPostgres(ctx context.Context, url, schema string) (target, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", envPostgres, err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	s, err := pgfence.New(pool)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return anyTarget[pgx.Tx]{&sinkTarget[pgx.Tx]{
		s: s,
		put: func(ctx context.Context, tx pgx.Tx, resource, value string) error {
			_, err := tx.Exec(ctx, `INSERT INTO lease_data (resource, value) VALUES ($1, $2)
				ON CONFLICT (resource) DO UPDATE SET value = excluded.value`, resource, value)
			return err
		},
		get: func(ctx context.Context, resource string) (string, error) {
			var v string
			err := pool.QueryRow(ctx, `SELECT value FROM lease_data WHERE resource = $1`, resource).Scan(&v)
			if errors.Is(err, pgx.ErrNoRows) {
				return "", nil
			}
			return v, err
		},
		closeFn: pool.Close,
	}}, nil
}

const sqliteData = `CREATE TABLE IF NOT EXISTS lease_data (resource TEXT PRIMARY KEY, value TEXT NOT NULL)`

func openSQLite(path string) (target, error) {
	if path == "" {
		return nil, fmt.Errorf("leasetest: no sink configured (%s unset)", envSQLite)
	}
	s, err := sqlitefence.Open(path)
	if err != nil {
		return nil, err
	}
	if _, err := s.DB().Exec(sqliteData); err != nil {
		_ = s.Close()
		return nil, err
	}
	return anyTarget[*sql.Tx]{&sinkTarget[*sql.Tx]{
		s: s,
		put: func(ctx context.Context, tx *sql.Tx, resource, value string) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO lease_data (resource, value) VALUES (?, ?)
				ON CONFLICT (resource) DO UPDATE SET value = excluded.value`, resource, value)
			return err
		},
		get: func(ctx context.Context, resource string) (string, error) {
			var v string
			err := s.DB().QueryRowContext(ctx, `SELECT value FROM lease_data WHERE resource = ?`, resource).Scan(&v)
			if errors.Is(err, sql.ErrNoRows) {
				return "", nil
			}
			return v, err
		},
		closeFn: func() { _ = s.Close() },
	}}, nil
}
