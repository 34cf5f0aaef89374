package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/fence/pgfence/pgbulk"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/fence/sqlitefence/sqlitebulk"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/pgoutbox"
	"github.com/batonhq/baton/outbox/sqliteoutbox"
)

// fencedStore is what the twins and the gateway need of a fence store: the fenced sink, and
// the keyed sink the gateway's inbox admits commands with.
type fencedStore[Tx any] interface {
	fence.Sink[Tx]
	fence.KeyedSink[Tx]
}

// store is one database as the program uses it, whatever its engine: the fence store, the
// outbox (Append in the handler's transaction, the relay's Store), and dialect-neutral views
// (sqldb.go) of a transaction and of the database for the program's own SQL
// (PostgreSQL's, with $N placeholders; the SQLite adapter rewrites them). The twins' fold
// writes through the fast path: fast is the sink its consumer runs over (pgbulk's Sink, which
// sends the fence statement in the upsert's round trip; SQLite's store itself) and upsert
// writes a batch's twin rows set-based (pgbulk, sqlitebulk).
type store[Tx any] struct {
	sink   fencedStore[Tx]
	fast   fence.Sink[Tx]
	upsert func(ctx context.Context, tx Tx, rows [][]any) error
	append func(ctx context.Context, tx Tx, src fence.Key, tok fence.Token, msgs ...outbox.Message) error
	outbox outbox.Store
	wrap   func(Tx) execer
	db     sqlDB
	close  func()
}

// The program's tables: the twins, and the gateway's record of applied commands.
const (
	twinsDDL = `CREATE TABLE IF NOT EXISTS twins (device TEXT PRIMARY KEY,
  reported DOUBLE PRECISION, desired DOUBLE PRECISION, version BIGINT NOT NULL, last_seq BIGINT NOT NULL)`
	appliedDDL = `CREATE TABLE IF NOT EXISTS applied (command_id TEXT PRIMARY KEY,
  device TEXT NOT NULL, set_temp DOUBLE PRECISION, times BIGINT NOT NULL)`
)

// A twin row, as the fold's set-based upsert writes it: {device, reported, desired, version,
// last_seq}, reported and desired nil when the batch did not change them. twinSet folds one
// into the row in the table (aliased t), in both SQL dialects: a nil column keeps its value,
// the versions add up, the last sequence number wins.
var twinColumns = [...][2]string{{"device", "text"}, {"reported", "double precision"},
	{"desired", "double precision"}, {"version", "bigint"}, {"last_seq", "bigint"}}

const twinSet = `reported = coalesce(excluded.reported, t.reported), desired = coalesce(excluded.desired, t.desired),
  version = t.version + excluded.version, last_seq = excluded.last_seq`

// twinRow is update u as a twin row: one version more, the other kind's column unchanged.
func twinRow(u update) []any {
	row := []any{u.Device, nil, nil, int64(1), int64(u.Seq)}
	if u.Kind == "desired" {
		row[2] = u.Temp
	} else {
		row[1] = u.Temp
	}
	return row
}

// mergeTwin folds row, a later update of the same device in the batch, into into, as twinSet
// would fold it into the table: so each device is written once per batch.
func mergeTwin(into, row []any) {
	for c := 1; c <= 2; c++ {
		if row[c] != nil {
			into[c] = row[c]
		}
	}
	into[3] = into[3].(int64) + row[3].(int64)
	into[4] = row[4]
}

func pgTwinUpsert() (*pgbulk.Upsert, error) {
	cols := make([]pgbulk.Column, len(twinColumns))
	for i, c := range twinColumns {
		cols[i] = pgbulk.Column{Name: c[0], Type: c[1]}
	}
	return pgbulk.NewUpsert("twins", []string{"device"}, cols, twinSet, pgbulk.Merge(mergeTwin))
}

func sqliteTwinUpsert() (*sqlitebulk.Upsert, error) {
	cols := make([]sqlitebulk.Column, len(twinColumns))
	for i, c := range twinColumns {
		cols[i] = sqlitebulk.Column{Name: c[0]}
	}
	return sqlitebulk.NewUpsert("twins", []string{"device"}, cols, twinSet, sqlitebulk.Merge(mergeTwin))
}

// openSQLite opens the embedded run's two SQLite files in dir: the twins' (fences, outbox,
// twins) and the gateway's (fences, keyed inbox, applied commands).
func openSQLite(ctx context.Context, dir string) (twins, gw *store[*sql.Tx], err error) {
	up, err := sqliteTwinUpsert()
	if err != nil {
		return nil, nil, err
	}
	open := func(name, ddl string) (*store[*sql.Tx], error) {
		fs, err := sqlitefence.Open(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		ob, err := sqliteoutbox.New(fs)
		if err == nil {
			err = ob.Migrate(ctx)
		}
		if err == nil {
			_, err = fs.DB().ExecContext(ctx, ddl)
		}
		if err != nil {
			fs.Close()
			return nil, err
		}
		upsert := func(ctx context.Context, tx *sql.Tx, rows [][]any) error { return up.Exec(ctx, tx, rows) }
		return &store[*sql.Tx]{sink: fs, fast: fs, upsert: upsert, append: ob.Append, outbox: ob, wrap: func(tx *sql.Tx) execer { return liteTx{tx} }, db: liteDB{fs.DB()},
			close: func() { fs.Close() }}, nil
	}
	if twins, err = open("twins.db", twinsDDL); err != nil {
		return nil, nil, err
	}
	if gw, err = open("gateway.db", appliedDDL); err != nil {
		twins.close()
		return nil, nil, err
	}
	return twins, gw, nil
}

// openPostgres connects to url. With fresh it first creates a schema of the run's own (the
// demo: runs never share a table) and migrates it; otherwise it uses the tables the search
// path finds, which -migrate created (a member: its role has no DDL rights).
func openPostgres(ctx context.Context, url string, fresh bool) (*store[pgx.Tx], string, error) {
	schema := ""
	if fresh {
		schema = fmt.Sprintf("twin_%08x", uint32(time.Now().UnixNano()))
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return nil, "", fmt.Errorf("PostgreSQL: %w", err)
		}
		_, err = conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
		conn.Close(ctx)
		if err != nil {
			return nil, "", fmt.Errorf("PostgreSQL: %w", err)
		}
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, "", fmt.Errorf("PostgreSQL URL: %w", err)
	}
	if schema != "" {
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, "", fmt.Errorf("PostgreSQL: %w", err)
	}
	st, err := pgStore(pool)
	if err == nil && fresh {
		err = migratePostgres(ctx, pool, "")
	}
	if err != nil {
		pool.Close()
		return nil, "", err
	}
	return st, schema, nil
}

func pgStore(pool *pgxpool.Pool) (*store[pgx.Tx], error) {
	fs, err := pgfence.New(pool)
	if err != nil {
		return nil, err
	}
	ob, err := pgoutbox.New(pool, fs)
	if err != nil {
		return nil, err
	}
	fast, err := pgbulk.NewSink(fs, pool)
	if err != nil {
		return nil, err
	}
	up, err := pgTwinUpsert()
	if err != nil {
		return nil, err
	}
	upsert := func(ctx context.Context, tx pgx.Tx, rows [][]any) error { return up.Exec(ctx, tx, rows) }
	return &store[pgx.Tx]{sink: fs, fast: fast, upsert: upsert, append: ob.Append, outbox: ob, wrap: func(tx pgx.Tx) execer { return pgTx{tx} }, db: pgDB{pool}, close: pool.Close}, nil
}

// migratePostgres creates every table of the program in the pool's schema (Baton's fences,
// recoveries, keyed inbox and outbox with the stores' own Migrate; the twins and the gateway's
// applied commands), idempotently, and grants role (if not "") what a member needs at run
// time and nothing more: the stores' RuntimeGrants, and DML on the program's tables.
func migratePostgres(ctx context.Context, pool *pgxpool.Pool, role string) error {
	fs, err := pgfence.New(pool)
	if err != nil {
		return err
	}
	ob, err := pgoutbox.New(pool, fs)
	if err != nil {
		return err
	}
	if err := errors.Join(fs.Migrate(ctx), ob.Migrate(ctx)); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	for _, ddl := range []string{twinsDDL, appliedDDL} {
		if _, err := pool.Exec(ctx, ddl); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
	}
	if role == "" {
		return nil
	}
	fg, err := fs.RuntimeGrants(role)
	if err != nil {
		return err
	}
	og, err := ob.RuntimeGrants(role)
	if err != nil {
		return err
	}
	r := pgx.Identifier{role}.Sanitize()
	grants := append(append(fg, og...), "GRANT SELECT, INSERT, UPDATE ON twins, applied TO "+r)
	for _, g := range grants {
		if _, err := pool.Exec(ctx, g); err != nil {
			return fmt.Errorf("grant: %w", err)
		}
	}
	return nil
}

// createTopics creates the run's topics on a real cluster: as many partitions as the embedded
// run's, replication factor 1 (deploy/local runs one broker).
func createTopics(ctx context.Context, brokers []string, n names) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for topic, parts := range map[string]int32{n.updates: 4, n.dlq: 4, n.commands: 2} {
		res, err := adm.CreateTopic(ctx, parts, 1, nil, topic)
		if err == nil {
			err = res.Err
		}
		if err != nil {
			return fmt.Errorf("creating topic %s on %s: %w", topic, strings.Join(brokers, ","), err)
		}
	}
	return nil
}
