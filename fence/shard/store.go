package shard

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
)

// Placements stores the history of a placement, one row per version, in the home shard's
// database (the table baton_placements). Versions only rise and a stored version never
// changes; the newest is the placement in force.
type Placements interface {
	// Migrate creates the placement table if it does not exist.
	Migrate(ctx context.Context) error
	// Load returns the newest placement; Version 0 and no error if none was published.
	Load(ctx context.Context) (Placement, error)
	// Publish stores p as the newest placement if p.Version is one above the newest stored
	// (1 for the first), with reason (required); otherwise it fails with fence.ErrConflict
	// and stores nothing. An invalid placement fails with fence.ErrInvalid. It checks nothing
	// about the keys' fences: once a placement is in force, publish the next through the
	// router ([Router.Publish]), which refuses to move a key whose old fence still admits
	// writes.
	Publish(ctx context.Context, p Placement, reason string) error
	// History returns every stored version, oldest first, with the reason it was published
	// for (a move's reason names the key, its old and new shard) and when.
	History(ctx context.Context) ([]Record, error)
}

// Record is one stored version of a placement: what was published, why and when (the
// database's clock; informational only).
type Record struct {
	Placement Placement
	Reason    string
	At        time.Time
}

const (
	pgSchema = `CREATE TABLE IF NOT EXISTS baton_placements (
	version   bigint PRIMARY KEY CHECK (version > 0),
	placement text NOT NULL,
	reason    text NOT NULL,
	at        timestamptz NOT NULL DEFAULT now())`
	pgLoad    = `SELECT version, placement FROM baton_placements ORDER BY version DESC LIMIT 1`
	pgHistory = `SELECT version, placement, reason, at FROM baton_placements ORDER BY version`
	pgPublish = `INSERT INTO baton_placements (version, placement, reason)
	SELECT $1::bigint, $2, $3 WHERE (SELECT coalesce(max(version), 0) FROM baton_placements) = $1::bigint - 1
	ON CONFLICT (version) DO NOTHING`

	sqliteSchema = `CREATE TABLE IF NOT EXISTS baton_placements (
	version   INTEGER PRIMARY KEY CHECK (version > 0),
	placement TEXT NOT NULL,
	reason    TEXT NOT NULL,
	at        TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)`
	sqliteLoad    = `SELECT version, placement FROM baton_placements ORDER BY version DESC LIMIT 1`
	sqliteHistory = `SELECT version, placement, reason, at FROM baton_placements ORDER BY version`
	sqlitePublish = `INSERT INTO baton_placements (version, placement, reason)
	SELECT ?1, ?2, ?3 WHERE (SELECT coalesce(max(version), 0) FROM baton_placements) = ?1 - 1
	ON CONFLICT (version) DO NOTHING`
)

// Postgres returns the placement history in a PostgreSQL database: the home shard's, through
// the pool its pgfence store uses (the pool's search_path picks the schema).
func Postgres(db pgfence.DB) Placements { return pgPlacements{db} }

// SQLite returns the placement history in an SQLite database: the home shard's, through its
// sqlitefence store's DB.
func SQLite(db *sql.DB) Placements { return sqlitePlacements{db} }

type pgPlacements struct{ db pgfence.DB }

func (s pgPlacements) Migrate(ctx context.Context) error {
	_, err := s.db.Exec(ctx, pgSchema)
	return wrap("migrate", err)
}

func (s pgPlacements) Load(ctx context.Context) (Placement, error) {
	var v int64
	var d string
	err := s.db.QueryRow(ctx, pgLoad).Scan(&v, &d)
	if errors.Is(err, pgx.ErrNoRows) {
		return Placement{}, nil
	}
	if err != nil {
		return Placement{}, wrap("load", err)
	}
	return decode(v, d)
}

func (s pgPlacements) Publish(ctx context.Context, p Placement, reason string) error {
	d, err := prepare(p, reason)
	if err != nil {
		return err
	}
	tag, err := s.db.Exec(ctx, pgPublish, p.Version, d, reason)
	if err != nil {
		return wrap("publish", err)
	}
	return published(p, tag.RowsAffected())
}

func (s pgPlacements) History(ctx context.Context) ([]Record, error) {
	rows, err := s.db.Query(ctx, pgHistory)
	if err != nil {
		return nil, wrap("history", err)
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		var v int64
		var d, reason string
		var at time.Time
		if err := rows.Scan(&v, &d, &reason, &at); err != nil {
			return nil, wrap("history", err)
		}
		p, err := decode(v, d)
		if err != nil {
			return nil, err
		}
		out = append(out, Record{Placement: p, Reason: reason, At: at})
	}
	return out, wrap("history", rows.Err())
}

type sqlitePlacements struct{ db *sql.DB }

func (s sqlitePlacements) History(ctx context.Context) ([]Record, error) {
	rows, err := s.db.QueryContext(ctx, sqliteHistory)
	if err != nil {
		return nil, wrap("history", err)
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		var v int64
		var d, reason, at string
		if err := rows.Scan(&v, &d, &reason, &at); err != nil {
			return nil, wrap("history", err)
		}
		p, err := decode(v, d)
		if err != nil {
			return nil, err
		}
		when, _ := time.Parse(time.DateTime, at) // CURRENT_TIMESTAMP's form, UTC
		out = append(out, Record{Placement: p, Reason: reason, At: when})
	}
	return out, wrap("history", rows.Err())
}

func (s sqlitePlacements) Migrate(ctx context.Context) error {
	_, err := s.db.ExecContext(ctx, sqliteSchema)
	return wrap("migrate", err)
}

func (s sqlitePlacements) Load(ctx context.Context) (Placement, error) {
	var v int64
	var d string
	err := s.db.QueryRowContext(ctx, sqliteLoad).Scan(&v, &d)
	if errors.Is(err, sql.ErrNoRows) {
		return Placement{}, nil
	}
	if err != nil {
		return Placement{}, wrap("load", err)
	}
	return decode(v, d)
}

func (s sqlitePlacements) Publish(ctx context.Context, p Placement, reason string) error {
	d, err := prepare(p, reason)
	if err != nil {
		return err
	}
	res, err := s.db.ExecContext(ctx, sqlitePublish, p.Version, d, reason)
	if err != nil {
		return wrap("publish", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return wrap("publish", err)
	}
	return published(p, n)
}

func prepare(p Placement, reason string) (string, error) {
	if reason == "" {
		return "", fmt.Errorf("%w: publishing placement %d needs a reason", fence.ErrInvalid, p.Version)
	}
	if err := p.validate(); err != nil {
		return "", err
	}
	return encode(p)
}

func published(p Placement, rows int64) error {
	if rows != 1 {
		return fmt.Errorf("%w: placement %d is not one above the newest stored", fence.ErrConflict, p.Version)
	}
	return nil
}

func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("shard: placements %s: %w", op, err)
}
