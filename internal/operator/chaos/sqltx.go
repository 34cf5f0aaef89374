package chaos

import (
	"context"
	"database/sql"
	"regexp"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Tx is the workload's view of a transaction, so one handler serves PostgreSQL (pgx.Tx) and
// SQLite (*sql.Tx). Statements use PostgreSQL's $N placeholders; the SQLite adapter rewrites
// them to SQLite's equivalent ?N.
type Tx interface {
	Exec(ctx context.Context, sql string, args ...any) error
	QueryRow(ctx context.Context, sql string, args ...any) Row
}

// Row is a single-row query result.
type Row interface{ Scan(dest ...any) error }

// DB is the workload's view of a database: transactions for the baselines, plain queries for
// the checker, and a dialect for the schema.
type DB interface {
	Begin(ctx context.Context) (Tx, func(context.Context) error, func(context.Context) error, error)
	Exec(ctx context.Context, sql string, args ...any) error
	Query(ctx context.Context, sql string, args ...any) (Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) Row
	Dialect() Dialect
}

// Rows iterates a query's result.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// Dialect names the SQL dialect of a DB.
type Dialect int

const (
	Postgres Dialect = iota + 1
	SQLite
)

// PgTx adapts a pgx.Tx.
func PgTx(tx pgx.Tx) Tx { return pgTx{tx} }

type pgTx struct{ tx pgx.Tx }

func (t pgTx) Exec(ctx context.Context, q string, args ...any) error {
	_, err := t.tx.Exec(ctx, q, args...)
	return err
}
func (t pgTx) QueryRow(ctx context.Context, q string, args ...any) Row {
	return t.tx.QueryRow(ctx, q, args...)
}

// PgDB adapts a pgx pool.
func PgDB(p *pgxpool.Pool) DB { return pgDB{p} }

type pgDB struct{ p *pgxpool.Pool }

func (d pgDB) Begin(ctx context.Context) (Tx, func(context.Context) error, func(context.Context) error, error) {
	tx, err := d.p.Begin(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	return pgTx{tx}, tx.Commit, tx.Rollback, nil
}
func (d pgDB) Exec(ctx context.Context, q string, args ...any) error {
	_, err := d.p.Exec(ctx, q, args...)
	return err
}
func (d pgDB) Query(ctx context.Context, q string, args ...any) (Rows, error) {
	r, err := d.p.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return r, nil
}
func (d pgDB) QueryRow(ctx context.Context, q string, args ...any) Row {
	return d.p.QueryRow(ctx, q, args...)
}
func (pgDB) Dialect() Dialect { return Postgres }

var dollar = regexp.MustCompile(`\$(\d+)`)

func toSQLite(q string) string { return dollar.ReplaceAllString(q, "?$1") }

// SQLTx adapts a database/sql transaction on SQLite.
func SQLTx(tx *sql.Tx) Tx { return sqlTx{tx} }

type sqlTx struct{ tx *sql.Tx }

func (t sqlTx) Exec(ctx context.Context, q string, args ...any) error {
	_, err := t.tx.ExecContext(ctx, toSQLite(q), args...)
	return err
}
func (t sqlTx) QueryRow(ctx context.Context, q string, args ...any) Row {
	return t.tx.QueryRowContext(ctx, toSQLite(q), args...)
}

// SQLDB adapts a database/sql handle on SQLite.
func SQLDB(db *sql.DB) DB { return sqlDB{db} }

type sqlDB struct{ db *sql.DB }

func (d sqlDB) Begin(ctx context.Context) (Tx, func(context.Context) error, func(context.Context) error, error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, nil, nil, err
	}
	return sqlTx{tx}, func(context.Context) error { return tx.Commit() }, func(context.Context) error { return tx.Rollback() }, nil
}
func (d sqlDB) Exec(ctx context.Context, q string, args ...any) error {
	_, err := d.db.ExecContext(ctx, toSQLite(q), args...)
	return err
}
func (d sqlDB) Query(ctx context.Context, q string, args ...any) (Rows, error) {
	r, err := d.db.QueryContext(ctx, toSQLite(q), args...)
	if err != nil {
		return nil, err
	}
	return sqlRows{r}, nil
}
func (d sqlDB) QueryRow(ctx context.Context, q string, args ...any) Row {
	return d.db.QueryRowContext(ctx, toSQLite(q), args...)
}
func (sqlDB) Dialect() Dialect { return SQLite }

type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }
