package status

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "modernc.org/sqlite" // the SQLite driver the sqlite stores use

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/internal/sqlident"
	"github.com/batonhq/baton/outbox/pgoutbox"
	"github.com/batonhq/baton/outbox/sqliteoutbox"
)

// Dialect is the kind of database a store lives in.
type Dialect string

// The dialects Baton's stores support.
const (
	Postgres Dialect = "postgres"
	SQLite   Dialect = "sqlite"
)

// Tables names the stores' tables; the zero value means the stores' defaults.
type Tables struct {
	Fence  string // the fence table (pgfence/sqlitefence Table); recoveries and keyed derive from it
	Outbox string // the outbox table (pgoutbox/sqliteoutbox Table); its cursors table derives from it
}

func (t Tables) withDefaults() Tables {
	if t.Fence == "" {
		t.Fence = "baton_fences" // the fence stores' default table
	}
	if t.Outbox == "" {
		t.Outbox = "baton_outbox" // pgoutbox's and sqliteoutbox's default (their Table option)
	}
	return t
}

func (t Tables) validate() error {
	var errs []error
	for _, n := range []string{t.Fence, t.Fence + "_recoveries", t.Outbox, t.Outbox + "_cursors"} {
		if err := sqlident.Validate(n); err != nil {
			errs = append(errs, errorf(ErrUsage, "table name %q: %v", n, err))
		}
	}
	return errors.Join(errs...)
}

// ParseStore tells a PostgreSQL URL (postgres:// or postgresql://) from an SQLite file path
// (optionally prefixed sqlite: or file:).
func ParseStore(addr string) (Dialect, string, error) {
	switch {
	case addr == "":
		return "", "", errorf(ErrUsage, "no store given: pass a PostgreSQL URL (postgres://...) or an SQLite file path")
	case strings.HasPrefix(addr, "postgres://"), strings.HasPrefix(addr, "postgresql://"):
		if _, err := pgx.ParseConfig(addr); err != nil {
			return "", "", errorf(ErrUsage, "store %s is not a valid PostgreSQL URL: %v", redact(addr), err)
		}
		return Postgres, addr, nil
	case strings.HasPrefix(addr, "sqlite:"):
		return SQLite, strings.TrimPrefix(addr, "sqlite:"), nil
	case strings.HasPrefix(addr, "file:"):
		return SQLite, strings.TrimPrefix(strings.TrimPrefix(addr, "file:"), "//"), nil
	case strings.Contains(addr, "://"):
		return "", "", errorf(ErrUsage, "store %s: only postgres:// URLs and SQLite file paths are supported", redact(addr))
	}
	return SQLite, addr, nil
}

// redact hides a URL's password.
func redact(addr string) string {
	u, err := url.Parse(addr)
	if err != nil || u.User == nil {
		return addr
	}
	return u.Redacted()
}

// Store reads (and, for recover and migrate, writes) the fence, recoveries and outbox tables
// of one database. Open it with [OpenStore]; Close releases it.
type Store struct {
	dialect Dialect
	addr    string // for messages: the redacted URL or the file path
	tables  Tables
	pg      *pgxpool.Pool
	sql     *sql.DB
	queries atomic.Int64 // statements sent, for Queries
}

// Access is what a [Store] may do to its database.
type Access int

const (
	// ReadOnly can change nothing: PostgreSQL sessions are read-only, an SQLite file is opened
	// read-only and must exist.
	ReadOnly Access = iota
	// ReadWrite may write (recover); an SQLite file must exist.
	ReadWrite
	// Create may write and creates a missing SQLite file (migrate).
	Create
)

// OpenStore opens the store at addr (see [ParseStore]) with the given access. It checks the
// database answers and fails with an error wrapping [ErrUnreachable] naming what was tried.
func OpenStore(ctx context.Context, addr string, tables Tables, access Access) (*Store, error) {
	writable := access != ReadOnly
	dialect, where, err := ParseStore(addr)
	if err != nil {
		return nil, err
	}
	tables = tables.withDefaults()
	if err := tables.validate(); err != nil {
		return nil, err
	}
	s := &Store{dialect: dialect, tables: tables}
	switch dialect {
	case Postgres:
		s.addr = redact(where)
		cfg, err := pgxpool.ParseConfig(where)
		if err != nil {
			return nil, errorf(ErrUsage, "store %s: %v", s.addr, err)
		}
		cfg.MaxConns = 4
		if !writable {
			// Set once connected, not as a startup parameter: there it would make every host
			// look read-only to target_session_attrs=read-write, and a multi-host URL that
			// follows the primary would find none.
			after := cfg.AfterConnect
			cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
				if after != nil {
					if err := after(ctx, c); err != nil {
						return err
					}
				}
				_, err := c.Exec(ctx, "SET default_transaction_read_only = on")
				return err
			}
		}
		s.pg, err = pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, errorf(ErrUnreachable, "PostgreSQL at %s: %v", s.addr, err)
		}
		if err := s.pg.Ping(ctx); err != nil {
			s.pg.Close()
			return nil, errorf(ErrUnreachable, "PostgreSQL at %s did not answer: %v", s.addr, pgCause(err))
		}
	case SQLite:
		abs, err := filepath.Abs(where)
		if err != nil {
			return nil, errorf(ErrUsage, "SQLite file %s: %v", where, err)
		}
		s.addr = abs
		if _, err := os.Stat(abs); err != nil && (access != Create || !errors.Is(err, os.ErrNotExist)) {
			return nil, errorf(ErrUnreachable, "SQLite file %s: %v", abs, err)
		}
		q := url.Values{}
		q.Add("_pragma", "busy_timeout(5000)")
		if writable {
			q.Add("_pragma", "journal_mode(WAL)")
			q.Add("_pragma", "synchronous(FULL)")
			q.Set("_txlock", "immediate")
		} else {
			q.Set("mode", "ro")
		}
		s.sql, err = sql.Open("sqlite", (&url.URL{Scheme: "file", Path: abs, RawQuery: q.Encode()}).String())
		if err != nil {
			return nil, errorf(ErrUnreachable, "SQLite file %s: %v", abs, err)
		}
		if err := s.sql.PingContext(ctx); err != nil {
			s.sql.Close()
			return nil, errorf(ErrUnreachable, "SQLite file %s: %v", abs, err)
		}
	}
	return s, nil
}

// pgCause shortens pgx's connect errors to their cause.
func pgCause(err error) string {
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) && errors.Unwrap(ce) != nil {
		err = errors.Unwrap(ce)
	}
	// pgx joins one error per address tried; the first says it.
	msg, _, _ := strings.Cut(err.Error(), "\n")
	return msg
}

// Close releases the database handle.
func (s *Store) Close() {
	if s.pg != nil {
		s.pg.Close()
	}
	if s.sql != nil {
		_ = s.sql.Close()
	}
}

// Queries returns how many statements the store's readers have sent since it was opened, so
// a long-running reader can bound and report its load on the database.
func (s *Store) Queries() int64 { return s.queries.Load() }

// Dialect returns the kind of database.
func (s *Store) Dialect() Dialect { return s.dialect }

// Addr returns the store's address for messages (a PostgreSQL URL without its password, or the
// SQLite file's absolute path).
func (s *Store) Addr() string { return s.addr }

// Describe says what the store is, for messages.
func (s *Store) Describe() string {
	if s.dialect == Postgres {
		return "PostgreSQL at " + s.addr
	}
	return "SQLite file " + s.addr
}

// rows runs a query and calls scan for each row.
func (s *Store) rows(ctx context.Context, query string, scan func(func(...any) error) error, args ...any) error {
	s.queries.Add(1)
	if s.pg != nil {
		rows, err := s.pg.Query(ctx, query, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			if err := scan(rows.Scan); err != nil {
				return err
			}
		}
		return rows.Err()
	}
	rows, err := s.sql.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows.Scan); err != nil {
			return err
		}
	}
	return rows.Err()
}

// tableExists reports whether a table exists.
func (s *Store) tableExists(ctx context.Context, name string) (bool, error) {
	s.queries.Add(1)
	var n int
	var err error
	if s.pg != nil {
		err = s.pg.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_class WHERE oid = to_regclass($1)`, sqlident.Quote(name)).Scan(&n)
	} else {
		schema, bare := "main", name
		if i := strings.LastIndexByte(name, '.'); i >= 0 {
			schema, bare = name[:i], name[i+1:]
		}
		err = s.sql.QueryRowContext(ctx, `SELECT count(*) FROM `+sqlident.Quote(schema)+`.sqlite_master WHERE type = 'table' AND name = ?`, bare).Scan(&n)
	}
	return n > 0, err
}

// Fence is one stored fence row.
type Fence struct {
	Topic     string      `json:"topic"`
	Partition int32       `json:"partition"`
	Token     fence.Token `json:"-"`
	Position  int64       `json:"position"`
	Claimant  string      `json:"claimant"` // who holds the stored token ("" on a row never claimed)
}

// Fences returns the group's fence rows ordered by topic and partition. A missing fence table
// fails with an error wrapping [ErrNotFound].
func (s *Store) Fences(ctx context.Context, group string) ([]Fence, error) {
	ok, err := s.tableExists(ctx, s.tables.Fence)
	if err != nil {
		return nil, fmt.Errorf("reading the fence table %s in %s: %w", s.tables.Fence, s.Describe(), err)
	}
	if !ok {
		return nil, errorf(ErrNotFound, "%s has no fence table %s (run 'baton migrate', or pass -fence-table)", s.Describe(), s.tables.Fence)
	}
	grp := "group_id"
	if s.dialect == SQLite {
		grp = "grp"
	}
	q := fmt.Sprintf(`SELECT topic, partition, era, epoch, position, claimant FROM %s WHERE %s = %s ORDER BY topic, partition`,
		sqlident.Quote(s.tables.Fence), grp, s.param(1))
	var out []Fence
	err = s.rows(ctx, q, func(scan func(...any) error) error {
		var f Fence
		if err := scan(&f.Topic, &f.Partition, &f.Token.Era, &f.Token.Epoch, &f.Position, &f.Claimant); err != nil {
			return err
		}
		out = append(out, f)
		return nil
	}, group)
	if err != nil {
		return nil, fmt.Errorf("reading the fences of group %q from %s: %w", group, s.Describe(), err)
	}
	return out, nil
}

func (s *Store) param(i int) string {
	if s.dialect == Postgres {
		return fmt.Sprintf("$%d", i)
	}
	return "?"
}

// Recoveries returns the group's recorded recoveries, oldest first.
func (s *Store) Recoveries(ctx context.Context, group string) ([]fence.Recovery, error) {
	table := s.tables.Fence + "_recoveries"
	ok, err := s.tableExists(ctx, table)
	if err != nil {
		return nil, fmt.Errorf("reading the recoveries table %s in %s: %w", table, s.Describe(), err)
	}
	if !ok {
		return nil, errorf(ErrNotFound, "%s has no recoveries table %s (run 'baton migrate', or pass -fence-table)", s.Describe(), table)
	}
	var q string
	if s.dialect == Postgres {
		q = `SELECT topic, partition, from_era, from_epoch, to_era, to_epoch, reason, at FROM ` + sqlident.Quote(table) +
			` WHERE group_id = $1 ORDER BY at, seq`
	} else {
		q = `SELECT topic, partition, from_era, from_epoch, to_era, to_epoch, reason, at_unix_ns FROM ` + sqlident.Quote(table) +
			` WHERE grp = ? ORDER BY seq`
	}
	var out []fence.Recovery
	err = s.rows(ctx, q, func(scan func(...any) error) error {
		r := fence.Recovery{Key: fence.Key{Group: group}}
		var at any
		if s.dialect == Postgres {
			at = &r.At
		} else {
			at = new(int64)
		}
		if err := scan(&r.Key.Topic, &r.Key.Partition, &r.From.Era, &r.From.Epoch, &r.To.Era, &r.To.Epoch, &r.Reason, at); err != nil {
			return err
		}
		if ns, ok := at.(*int64); ok {
			r.At = time.Unix(0, *ns)
		}
		r.At = r.At.UTC()
		out = append(out, r)
		return nil
	}, group)
	if err != nil {
		return nil, fmt.Errorf("reading the recoveries of group %q from %s: %w", group, s.Describe(), err)
	}
	return out, nil
}

// Backlogs returns the outbox backlog (appended, not yet delivered) per source partition of
// the group, keyed by fence.Key. A store without the outbox's cursors table returns nil, nil:
// the application does not use the outbox.
func (s *Store) Backlogs(ctx context.Context, group string) (map[fence.Key]int64, error) {
	table := s.tables.Outbox + "_cursors"
	ok, err := s.tableExists(ctx, table)
	if err != nil || !ok {
		return nil, err
	}
	grp := "group_id"
	if s.dialect == SQLite {
		grp = "grp"
	}
	q := fmt.Sprintf(`SELECT topic, partition, last_seq - delivered_seq FROM %s WHERE %s = %s`, sqlident.Quote(table), grp, s.param(1))
	out := map[fence.Key]int64{}
	err = s.rows(ctx, q, func(scan func(...any) error) error {
		k := fence.Key{Group: group}
		var n int64
		if err := scan(&k.Topic, &k.Partition, &n); err != nil {
			return err
		}
		out[k] = n
		return nil
	}, group)
	if err != nil {
		return nil, fmt.Errorf("reading the outbox backlog of group %q from %s: %w", group, s.Describe(), err)
	}
	return out, nil
}

// recoverer is what recover needs of a fence store: both pgfence and sqlitefence have it.
type recoverer interface {
	Load(ctx context.Context, k fence.Key) (fence.State, error)
	Recover(ctx context.Context, k fence.Key, expected fence.Token, epoch int64, claimant, reason string) (fence.Token, error)
}

// sink returns the fence store on this database, for Load and Recover.
func (s *Store) sink() (recoverer, error) {
	if s.pg != nil {
		return pgfence.New(s.pg, pgfence.Table(s.tables.Fence))
	}
	return sqlitefence.New(s.sql, sqlitefence.Table(s.tables.Fence))
}

// migrator is a store's Schema and Migrate.
type migrator interface {
	Schema() string
	Migrate(ctx context.Context) error
}

// migrators returns the fence store (fence, recoveries, keyed inbox tables) and the outbox
// store (outbox and cursors tables) on this database.
func (s *Store) migrators() ([]migrator, error) {
	if s.pg != nil {
		return pgMigrators(s.pg, s.tables)
	}
	return sqliteMigrators(s.sql, s.tables)
}

func pgMigrators(db pgfence.DB, t Tables) ([]migrator, error) {
	f, err := pgfence.New(db, pgfence.Table(t.Fence))
	if err != nil {
		return nil, err
	}
	o, err := pgoutbox.New(db, f, pgoutbox.Table(t.Outbox))
	if err != nil {
		return nil, err
	}
	return []migrator{f, o}, nil
}

func sqliteMigrators(db *sql.DB, t Tables) ([]migrator, error) {
	f, err := sqlitefence.New(db, sqlitefence.Table(t.Fence))
	if err != nil {
		return nil, err
	}
	o, err := sqliteoutbox.New(f, sqliteoutbox.Table(t.Outbox))
	if err != nil {
		return nil, err
	}
	return []migrator{f, o}, nil
}
