package main

import (
	"context"
	"database/sql"
	"regexp"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The program's own SQL runs on PostgreSQL and on SQLite: it is written in PostgreSQL's
// dialect ($N placeholders), and the SQLite views below rewrite the placeholders to SQLite's
// equivalent ?N.

// execer runs a statement in a transaction or on the database.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) error
}

// sqlDB is the database outside any handler's transaction.
type sqlDB interface {
	execer
	Query(ctx context.Context, sql string, args ...any) (sqlRows, error)
	QueryRow(ctx context.Context, sql string, args ...any) sqlRow
}

type sqlRow interface{ Scan(dest ...any) error }

type sqlRows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

type pgTx struct{ tx pgx.Tx }

func (t pgTx) Exec(ctx context.Context, q string, args ...any) error {
	_, err := t.tx.Exec(ctx, q, args...)
	return err
}

type pgDB struct{ p *pgxpool.Pool }

func (d pgDB) Exec(ctx context.Context, q string, args ...any) error {
	_, err := d.p.Exec(ctx, q, args...)
	return err
}
func (d pgDB) Query(ctx context.Context, q string, args ...any) (sqlRows, error) {
	r, err := d.p.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return r, nil
}
func (d pgDB) QueryRow(ctx context.Context, q string, args ...any) sqlRow {
	return d.p.QueryRow(ctx, q, args...)
}

var dollar = regexp.MustCompile(`\$(\d+)`)

func toSQLite(q string) string { return dollar.ReplaceAllString(q, "?$1") }

type liteTx struct{ tx *sql.Tx }

func (t liteTx) Exec(ctx context.Context, q string, args ...any) error {
	_, err := t.tx.ExecContext(ctx, toSQLite(q), args...)
	return err
}

type liteDB struct{ db *sql.DB }

func (d liteDB) Exec(ctx context.Context, q string, args ...any) error {
	_, err := d.db.ExecContext(ctx, toSQLite(q), args...)
	return err
}
func (d liteDB) Query(ctx context.Context, q string, args ...any) (sqlRows, error) {
	r, err := d.db.QueryContext(ctx, toSQLite(q), args...)
	if err != nil {
		return nil, err
	}
	return liteRows{r}, nil
}
func (d liteDB) QueryRow(ctx context.Context, q string, args ...any) sqlRow {
	return d.db.QueryRowContext(ctx, toSQLite(q), args...)
}

type liteRows struct{ *sql.Rows }

func (r liteRows) Close() { _ = r.Rows.Close() }
