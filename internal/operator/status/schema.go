package status

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/batonhq/baton/fence/shard"
)

// Schema writes the DDL of every Baton table on dialect: the fence store's (fences,
// recoveries, keyed inbox) and the outbox store's (outbox, cursors), as the stores' own
// Schema() gives it, then the runtime role's grants (see [RuntimeGrants]). It does no I/O.
func Schema(w io.Writer, dialect Dialect, tables Tables, runtimeRole string) error {
	tables = tables.withDefaults()
	if err := tables.validate(); err != nil {
		return err
	}
	var ms []migrator
	var err error
	switch dialect {
	case Postgres:
		pool, perr := schemaPool()
		if perr != nil {
			return perr
		}
		defer pool.Close()
		ms, err = pgMigrators(pool, tables)
	case SQLite:
		db, oerr := sql.Open("sqlite", ":memory:") // no I/O until used
		if oerr != nil {
			return oerr
		}
		defer db.Close()
		ms, err = sqliteMigrators(db, tables)
	default:
		return errorf(ErrUsage, "unknown dialect %q (postgres or sqlite)", dialect)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "-- Baton schema for %s: fence store (fences, recoveries, keyed inbox), then outbox store (outbox, cursors).\n", dialect)
	for _, m := range ms {
		fmt.Fprintln(w, strings.TrimSpace(m.Schema()))
		fmt.Fprintln(w)
	}
	if runtimeRole != "" && dialect == Postgres {
		fmt.Fprintf(w, "-- Least-privilege runtime role %s (no DDL, no TRUNCATE): run as the migration role after the DDL.\n", runtimeRole)
		for _, m := range ms {
			g, ok := m.(interface {
				RuntimeGrants(string) ([]string, error)
			})
			if !ok {
				continue
			}
			stmts, err := g.RuntimeGrants(runtimeRole)
			if err != nil {
				return errorf(ErrUsage, "runtime role: %v", err)
			}
			for _, st := range stmts {
				fmt.Fprintln(w, strings.TrimSuffix(st, ";")+";")
			}
		}
	}
	return nil
}

// ShardedSchema writes the DDL of a sharded sink's databases (fence/shard): every Baton table
// (see [Schema]) for each shard, then the placement table for the home shard (the first) only,
// with its runtime grant. It does no I/O.
func ShardedSchema(w io.Writer, dialect Dialect, tables Tables, runtimeRole string, shards []string) error {
	if len(shards) == 0 {
		return Schema(w, dialect, tables, runtimeRole)
	}
	fmt.Fprintf(w, "-- Sharded sink: run on each shard's database (%s).\n", strings.Join(shards, ", "))
	if err := Schema(w, dialect, tables, runtimeRole); err != nil {
		return err
	}
	var pl interface{ Schema() string }
	switch dialect {
	case Postgres:
		pool, err := schemaPool()
		if err != nil {
			return err
		}
		defer pool.Close()
		pl, _ = shard.Postgres(pool).(interface{ Schema() string })
	case SQLite:
		db, err := sql.Open("sqlite", ":memory:")
		if err != nil {
			return err
		}
		defer db.Close()
		pl, _ = shard.SQLite(db).(interface{ Schema() string })
	}
	if pl == nil {
		return fmt.Errorf("status: the placement store of %s does not give its schema", dialect)
	}
	fmt.Fprintf(w, "\n-- Home shard %s only: the placement's history (fence/shard's Placements).\n%s\n", shards[0], strings.TrimSpace(pl.Schema()))
	if g, ok := pl.(interface {
		RuntimeGrants(string) ([]string, error)
	}); ok && runtimeRole != "" {
		stmts, err := g.RuntimeGrants(runtimeRole)
		if err != nil {
			return errorf(ErrUsage, "runtime role: %v", err)
		}
		for _, st := range stmts {
			fmt.Fprintln(w, strings.TrimSuffix(st, ";")+";")
		}
	}
	return nil
}

// Migrate applies the DDL of every Baton table (see [Schema]) on the store at addr, with the
// stores' own Migrate (idempotent; PostgreSQL under an advisory lock). It reports what it did.
func Migrate(ctx context.Context, w io.Writer, addr string, tables Tables) error {
	return MigrateShards(ctx, w, []ShardAddr{{Store: addr}}, tables)
}

// MigrateShards applies the DDL of every Baton table on each shard's database, as [Migrate]
// does for one, and creates the placement table in the home shard (the first) when there are
// several shards, or the only one is named. A shard that cannot be reached or migrated is
// named in the error; the others are still migrated.
func MigrateShards(ctx context.Context, w io.Writer, shards []ShardAddr, tables Tables) error {
	sharded := len(shards) > 1 || (len(shards) == 1 && shards[0].Name != "")
	var errs []error
	for i, sh := range shards {
		err := migrateOne(ctx, w, sh, tables, sharded && i == 0)
		if err != nil && sh.Name != "" {
			err = fmt.Errorf("shard %s: %w", sh.Name, err)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func migrateOne(ctx context.Context, w io.Writer, sh ShardAddr, tables Tables, home bool) error {
	st, err := OpenStore(ctx, sh.Store, tables, Create)
	if err != nil {
		return err
	}
	defer st.Close()
	ms, err := st.migrators()
	if err != nil {
		return err
	}
	extra := ""
	if home {
		pm, ok := st.placements().(migrator)
		if !ok {
			return fmt.Errorf("the placement store of %s does not migrate", st.Describe())
		}
		ms = append(ms, pm)
		extra = ", " + placementTable
	}
	for _, m := range ms {
		if err := m.Migrate(ctx); err != nil {
			return fmt.Errorf("migrating %s: %w", st.Describe(), err)
		}
	}
	what := st.Describe()
	if sh.Name != "" {
		what = "shard " + sh.Name + " (" + what + ")"
	}
	_, err = fmt.Fprintf(w, "migrated %s: tables %s, %s_recoveries, %s_keyed, %s, %s_cursors%s exist\n", what,
		st.tables.Fence, st.tables.Fence, st.tables.Fence, st.tables.Outbox, st.tables.Outbox, extra)
	return err
}

// schemaPool is a pool created without connecting: the stores only need one to exist to give
// their schema.
func schemaPool() (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig("postgres://schema-only/")
	if err != nil {
		return nil, err
	}
	return pgxpool.NewWithConfig(context.Background(), cfg)
}
