package status

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
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
		// A pool is created without connecting; the stores only need it to exist.
		cfg, perr := pgxpool.ParseConfig("postgres://schema-only/")
		if perr != nil {
			return perr
		}
		pool, perr := pgxpool.NewWithConfig(context.Background(), cfg)
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

// Migrate applies the DDL of every Baton table (see [Schema]) on the store at addr, with the
// stores' own Migrate (idempotent; PostgreSQL under an advisory lock). It reports what it did.
func Migrate(ctx context.Context, w io.Writer, addr string, tables Tables) error {
	st, err := OpenStore(ctx, addr, tables, Create)
	if err != nil {
		return err
	}
	defer st.Close()
	ms, err := st.migrators()
	if err != nil {
		return err
	}
	for _, m := range ms {
		if err := m.Migrate(ctx); err != nil {
			return fmt.Errorf("migrating %s: %w", st.Describe(), err)
		}
	}
	_, err = fmt.Fprintf(w, "migrated %s: tables %s, %s_recoveries, %s_keyed, %s, %s_cursors exist\n", st.Describe(),
		st.tables.Fence, st.tables.Fence, st.tables.Fence, st.tables.Outbox, st.tables.Outbox)
	return err
}
