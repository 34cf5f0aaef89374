package shard

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/batonhq/baton/fence/fencetest"
)

// TestConformancePostgres runs the fence conformance suite over a router of three shards, a
// schema each on the PostgreSQL server of BATON_POSTGRES_URL, or on the three clusters of
// BATON_POSTGRES_SHARD_URLS when it is set. The caller-held transaction
// cases (Advance) are skipped: a transaction belongs to one shard, and the suite picks keys.
// So are the keyed cases: a keyed fence is per shard, and the suite admits one entity in
// transactions of scratch keys that live on different shards (TestAdmitInTheKeysShard covers
// the router's Admit).
func TestConformancePostgres(t *testing.T) {
	fencetest.Run(t, func(t *testing.T) fencetest.Env[pgx.Tx] {
		shards, pools, pl := pgShards(t, names3...)
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

// TestConformanceSQLite runs the suite over a router of three SQLite files.
func TestConformanceSQLite(t *testing.T) {
	fencetest.Run(t, func(t *testing.T) fencetest.Env[*sql.Tx] {
		shards, stores, pl := liteShards(t, names3...)
		r := newRouter(t, shards, pl)
		return fencetest.Env[*sql.Tx]{
			Sink: r, Write: writeLite,
			Read: func(ctx context.Context, k string) (string, bool, error) {
				for _, n := range names3 {
					var v string
					err := stores[n].DB().QueryRowContext(ctx, `SELECT v FROM kv WHERE k = ?`, k).Scan(&v)
					if err == nil {
						return v, true, nil
					}
					if !errors.Is(err, sql.ErrNoRows) {
						return "", false, err
					}
				}
				return "", false, nil
			},
		}
	})
}
