package chaos

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/outbox/pgoutbox"
	"github.com/batonhq/baton/outbox/sqliteoutbox"
)

// RunPostgres runs cfg against the PostgreSQL at pgURL, in a fresh schema of its own that it
// creates and migrates (fence, outbox and workload tables). It returns the run's database for reports and a
// cleanup that closes it; cleanup is set whenever the database was opened, even with an error.
func RunPostgres(ctx context.Context, cfg Config, pgURL string) (*Result, DB, func(), error) {
	schema := fmt.Sprintf("chaos_%s_%d", cfg.Mode, time.Now().UnixNano())
	admin, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		return nil, nil, nil, err
	}
	_, err = admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	admin.Close(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	sep := "?"
	if strings.Contains(pgURL, "?") {
		sep = "&"
	}
	cfg.PostgresURL, cfg.SQLitePath = pgURL+sep+"search_path="+schema, ""
	pool, err := pgxpool.New(ctx, cfg.PostgresURL)
	if err != nil {
		return nil, nil, nil, err
	}
	db := PgDB(pool)
	if _, err := preparePostgres(ctx, pool); err != nil {
		return nil, db, pool.Close, err
	}
	res, err := Run(ctx, cfg, db)
	return res, db, pool.Close, err
}

// preparePostgres creates the fence, outbox and workload tables in the pool's schema.
func preparePostgres(ctx context.Context, pool *pgxpool.Pool) (*pgfence.Store, error) {
	store, err := pgfence.New(pool)
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil {
		return nil, err
	}
	box, err := pgoutbox.New(pool, store)
	if err != nil {
		return nil, err
	}
	if err := box.Migrate(ctx); err != nil {
		return nil, err
	}
	return store, Migrate(ctx, PgDB(pool))
}

// RunSQLite runs cfg against the SQLite file at path, which it creates and migrates (fence,
// outbox and workload tables). It returns the run's database for reports and a cleanup that closes it;
// cleanup is set whenever the database was opened, even with an error.
func RunSQLite(ctx context.Context, cfg Config, path string) (*Result, DB, func(), error) {
	store, err := sqlitefence.Open(path)
	if err != nil {
		return nil, nil, nil, err
	}
	cleanup := func() { _ = store.Close() }
	db := SQLDB(store.DB())
	if err := Migrate(ctx, db); err != nil {
		return nil, db, cleanup, err
	}
	if box, err := sqliteoutbox.New(store); err != nil {
		return nil, db, cleanup, err
	} else if err := box.Migrate(ctx); err != nil { // creates the outbox tables
		return nil, db, cleanup, err
	}
	cfg.SQLitePath, cfg.PostgresURL = path, ""
	res, err := Run(ctx, cfg, db)
	return res, db, cleanup, err
}

// Owner is a partition's current writer as the database records it: the worker and token of
// the partition's last committed batch.
type Owner struct {
	Worker string
	Token  fence.Token
}

// Ownership is a live view of a run, read from its database (the demo prints it while the run
// goes on).
type Ownership struct {
	Owners  map[int32]Owner // by partition; a partition without a committed batch is absent
	Applied int64           // records folded into the state so far
}

// ReadOwnership reads each partition's current owner and the records applied so far.
func ReadOwnership(ctx context.Context, db DB) (Ownership, error) {
	o := Ownership{Owners: map[int32]Owner{}}
	rows, err := db.Query(ctx, `SELECT a.part, a.worker, a.era, a.epoch FROM chaos_applied a
JOIN (SELECT part, max(id) AS id FROM chaos_applied GROUP BY part) m ON a.id = m.id`)
	if err != nil {
		return o, fmt.Errorf("chaos: read owners: %w", err)
	}
	for rows.Next() {
		var p int32
		var w Owner
		if err := rows.Scan(&p, &w.Worker, &w.Token.Era, &w.Token.Epoch); err != nil {
			rows.Close()
			return o, fmt.Errorf("chaos: read owners: %w", err)
		}
		o.Owners[p] = w
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return o, fmt.Errorf("chaos: read owners: %w", err)
	}
	if err := db.QueryRow(ctx, `SELECT coalesce(sum(n), 0) FROM chaos_state`).Scan(&o.Applied); err != nil {
		return o, fmt.Errorf("chaos: read applied count: %w", err)
	}
	return o, nil
}
