package sqlitefence

import (
	"context"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"modernc.org/sqlite"

	"github.com/batonhq/baton/fence"
)

//go:embed schema.sql
var schemaSQL string

// Store is a fenced sink in one SQLite database. It implements [fence.Sink] and
// [fence.KeyedSink] for *sql.Tx. All methods are safe for concurrent use.
type Store struct {
	db          *sql.DB
	owned       bool // Close closes db: Open opened it
	busyTimeout time.Duration
	table       string // the fence table's name, as configured
	q           queries

	// gate serializes the store's own write transactions (Claim, Apply, Recover) within the
	// process. SQLite admits one writer at a time anyway; waiting here hands the lock over as
	// soon as it is released instead of polling it in SQLite's busy handler.
	gate chan struct{}

	// The statements of the per-batch and per-message paths, prepared once the tables exist
	// (by Migrate, or by the first Apply or Recover): preparing the fence UPDATE costs about as
	// much as running it. Tx.StmtContext reuses them per pooled connection, and refuses a
	// transaction of another *sql.DB. Until they are prepared the same SQL runs unprepared.
	stmts preparedStmts

	// onBusy, if set, is called before each retry after SQLITE_BUSY (a test hook).
	onBusy func()
}

var (
	_ fence.Sink[*sql.Tx]      = (*Store)(nil)
	_ fence.KeyedSink[*sql.Tx] = (*Store)(nil)
)

// Open opens (creating it if needed) the SQLite database file at path with the
// modernc.org/sqlite driver and returns a store that owns it: [Store.Close] closes it. Unlike
// [New], Open does I/O: it checks the journal mode and runs [Store.Migrate], so the store is
// ready to use.
//
// Every connection is set up with journal_mode=WAL, synchronous=FULL (see [SyncNormal]),
// foreign_keys=ON, busy_timeout=[BusyTimeout], and begins its read-write transactions with
// BEGIN IMMEDIATE, so a transaction holds the write lock from its start: no two writers
// interleave a fence check and advance, and no transaction fails late upgrading a read lock.
// Transactions the caller begins on [Store.DB] behave the same way. Open fails if the file
// cannot be put in WAL mode (as on some network file systems). path is a file-system path, not
// a URI; ":memory:" is refused, since every pooled connection would get its own database.
func Open(path string, opts ...Option) (*Store, error) {
	cfg, err := newConfig(opts)
	if path == "" || path == ":memory:" {
		err = errors.Join(fmt.Errorf("%w: Open needs a database file path, got %q", fence.ErrInvalid, path), err)
	}
	if err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("sqlitefence: open %s: %w", path, err)
	}
	db, err := sql.Open("sqlite", dsn(abs, cfg))
	if err != nil {
		return nil, fmt.Errorf("sqlitefence: open %s: %w", path, err)
	}
	// The DSN's settings run on every new connection; a failure to switch to WAL is silent
	// there, so check it on the first one.
	var mode string
	if err := db.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlitefence: open %s: %w", path, wrapBusy(err))
	}
	if !strings.EqualFold(mode, "wal") {
		db.Close()
		return nil, fmt.Errorf("sqlitefence: open %s: journal mode is %q, not WAL (is the file on a network file system?)", path, mode)
	}
	s := newStore(db, true, cfg)
	if err := s.Migrate(context.Background()); err != nil {
		s.Close()
		return nil, fmt.Errorf("sqlitefence: open %s: %w", path, err)
	}
	return s, nil
}

// dsn builds the modernc driver's connection string: a file: URI, so that no byte of the path
// can be read as a query parameter, carrying the settings every pooled connection applies.
func dsn(abs string, cfg config) string {
	var b strings.Builder
	b.WriteString("file://")
	for i := 0; i < len(abs); i++ {
		switch c := abs[i]; c {
		case '%', '?', '#':
			fmt.Fprintf(&b, "%%%02X", c)
		default:
			b.WriteByte(c)
		}
	}
	q := url.Values{}
	q.Set("_txlock", "immediate")
	q.Set("_busy_timeout", strconv.FormatInt(cfg.busyTimeout.Milliseconds(), 10))
	q.Set("_journal_mode", "WAL")
	q.Set("_synchronous", cfg.sync)
	q.Set("_foreign_keys", "1")
	b.WriteByte('?')
	b.WriteString(q.Encode())
	return b.String()
}

// New returns a store over db, a database the caller opened with the modernc.org/sqlite driver
// and keeps owning: the caller's own tables live in the same file and their writes share the
// store's transactions. [Store.Close] leaves db open. New does no I/O: call [Store.Migrate]
// to create the tables (or create them yourself from [Store.Schema]). A nil option, an invalid
// value or a database of another driver fails with an error wrapping fence.ErrInvalid; every
// problem is reported, joined with errors.Join.
//
// New changes none of db's settings. For the guarantees [Open] gives, open db with WAL, a
// busy timeout and synchronous=FULL, e.g. "file:///path/x.db?_journal_mode=WAL&_synchronous=FULL&_busy_timeout=5000&_txlock=immediate".
// Without _txlock=immediate the store's own transactions are still safe: each starts with a
// write, which takes the write lock before anything is read, and SQLITE_BUSY is retried
// within [BusyTimeout]. Transactions the caller begins are the caller's: one that reads before
// its first write may fail with SQLITE_BUSY when it upgrades to the write lock.
func New(db *sql.DB, opts ...Option) (*Store, error) {
	var errs []error
	if db == nil {
		errs = append(errs, fmt.Errorf("%w: sqlitefence: nil *sql.DB", fence.ErrInvalid))
	} else if _, ok := db.Driver().(*sqlite.Driver); !ok {
		errs = append(errs, fmt.Errorf("%w: the *sql.DB uses driver %T; sqlitefence needs modernc.org/sqlite", fence.ErrInvalid, db.Driver()))
	}
	cfg, err := newConfig(opts)
	errs = append(errs, err)
	if cfg.syncSet {
		errs = append(errs, fmt.Errorf("%w: the SyncNormal option applies to Open only; New leaves the caller's settings alone", fence.ErrInvalid))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return newStore(db, false, cfg), nil
}

// Table returns the fence table's name, as configured with [Table]: the table sqliteoutbox
// checks tokens against.
func (s *Store) Table() string { return s.table }

func newStore(db *sql.DB, owned bool, cfg config) *Store {
	return &Store{
		db:          db,
		owned:       owned,
		busyTimeout: cfg.busyTimeout,
		table:       cfg.table,
		q:           newQueries(newNames(cfg.table)),
		gate:        make(chan struct{}, 1),
	}
}

// Schema returns the DDL Migrate runs, with the configured table names, for users who manage
// migrations with their own tools.
func (s *Store) Schema() string { return s.q.schema }

// Migrate creates the tables if they do not exist, in one write transaction (so it waits for
// the write lock like any other write, up to [BusyTimeout], and fails with [ErrBusy] past it),
// and prepares the statements of the per-batch paths. It is idempotent and safe to call
// concurrently, from several processes too: SQLite serializes the DDL under its write lock.
func (s *Store) Migrate(ctx context.Context) error {
	err := s.writeTx(ctx, func(ctx context.Context, tx *sql.Tx, _ func()) error {
		if _, err := tx.ExecContext(ctx, s.q.schema); err != nil {
			return err
		}
		// A table created before the claimant column existed gets it; SQLite has no
		// ADD COLUMN IF NOT EXISTS, and a failed statement leaves the transaction usable.
		if _, err := tx.ExecContext(ctx, s.q.addClaimant); err != nil && !strings.Contains(err.Error(), "duplicate column name") {
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("sqlitefence: migrate: %w", err)
	}
	if err := s.stmts.prepare(ctx, s.db, s.q); err != nil {
		return fmt.Errorf("sqlitefence: migrate: preparing statements: %w", wrapBusy(err))
	}
	return nil
}

// preparedStmts holds the prepared statements of Advance and Admit once the tables exist.
type preparedStmts struct {
	mu             sync.Mutex
	closed         bool
	advance, admit *sql.Stmt
}

// prepare prepares the statements if they are not yet. It must not be called while the caller
// holds one of db's connections in a transaction: with a pool of one it would wait for ever.
func (p *preparedStmts) prepare(ctx context.Context, db *sql.DB, q queries) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.advance != nil {
		return nil
	}
	advance, err := db.PrepareContext(ctx, q.advanceUpdate)
	if err != nil {
		return err
	}
	admit, err := db.PrepareContext(ctx, q.admit)
	if err != nil {
		advance.Close()
		return err
	}
	p.advance, p.admit = advance, admit
	return nil
}

// exec runs the prepared statement pick selects inside tx, the caller's transaction on db. If
// the statements are not prepared yet it prepares them when db's pool has a connection to
// spare (the caller holds one: with a pool of one, preparing would wait for ever), and
// otherwise runs query unprepared.
func (p *preparedStmts) exec(ctx context.Context, db *sql.DB, q queries, tx *sql.Tx, pick func(*preparedStmts) *sql.Stmt, query string, args ...any) (sql.Result, error) {
	p.mu.Lock()
	st := pick(p)
	p.mu.Unlock()
	if st == nil {
		if stats := db.Stats(); stats.MaxOpenConnections == 0 || stats.InUse < stats.MaxOpenConnections {
			_ = p.prepare(ctx, db, q) // on failure the unprepared statement reports the cause
			p.mu.Lock()
			st = pick(p)
			p.mu.Unlock()
		}
	}
	if st == nil {
		return tx.ExecContext(ctx, query, args...)
	}
	return tx.StmtContext(ctx, st).ExecContext(ctx, args...)
}

func (p *preparedStmts) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.advance == nil {
		return nil
	}
	return errors.Join(p.advance.Close(), p.admit.Close())
}

// DB returns the database the store writes to. Use it to begin transactions for
// [Store.Advance] and [Store.Admit] and to reach your own tables in the same file.
func (s *Store) DB() *sql.DB { return s.db }

// Close releases the store's prepared statements and closes the database if [Open] opened
// it; a store made by [New] leaves the caller's database open.
func (s *Store) Close() error {
	err := s.stmts.close()
	if s.owned {
		err = errors.Join(err, s.db.Close())
	}
	return err
}

// writeTx runs body in a new read-write transaction and commits it. While the transaction has
// done nothing irrevocable (body calls irrevocable before it hands the transaction to code
// that must not run twice), SQLITE_BUSY rolls it back and tries again until the busy timeout
// has elapsed; after that point, or after the timeout, the busy error is returned wrapped in
// [ErrBusy]. Every error leaves nothing committed.
func (s *Store) writeTx(ctx context.Context, body func(ctx context.Context, tx *sql.Tx, irrevocable func()) error) error {
	// Before any connection is held; on failure (no tables yet) the statements run unprepared.
	_ = s.stmts.prepare(ctx, s.db, s.q)
	deadline := time.Now().Add(s.busyTimeout)
	backoff := time.Millisecond
	for {
		if err := s.acquire(ctx, deadline); err != nil {
			return err
		}
		err, retry := s.attempt(ctx, body)
		<-s.gate
		if err == nil {
			return nil
		}
		if !retry {
			return wrapBusy(err)
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return fmt.Errorf("%w: still busy after %s: %w", ErrBusy, s.busyTimeout, err)
		}
		if s.onBusy != nil {
			s.onBusy()
		}
		wait = min(wait, backoff)
		backoff = min(2*backoff, 50*time.Millisecond)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("sqlitefence: %w while waiting for the write lock: %w", ctx.Err(), wrapBusy(err))
		case <-t.C:
		}
	}
}

// acquire takes the store's writer gate, waiting at most until deadline.
func (s *Store) acquire(ctx context.Context, deadline time.Time) error {
	select {
	case s.gate <- struct{}{}:
		return nil
	default:
	}
	wait := time.Until(deadline)
	if wait <= 0 {
		return fmt.Errorf("%w: another write transaction of this store holds the lock", ErrBusy)
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case s.gate <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("sqlitefence: %w while waiting for the write lock", ctx.Err())
	case <-t.C:
		return fmt.Errorf("%w: another write transaction of this store held the lock for %s", ErrBusy, s.busyTimeout)
	}
}

// attempt runs body once; retry reports whether the failure was SQLITE_BUSY before anything
// irrevocable happened.
func (s *Store) attempt(ctx context.Context, body func(context.Context, *sql.Tx, func()) error) (err error, retry bool) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err, isBusy(err)
	}
	irrevocable := false
	if err := body(ctx, tx, func() { irrevocable = true }); err != nil {
		_ = tx.Rollback() // the body's error is the one that matters; the tx is discarded either way
		return err, !irrevocable && isBusy(err)
	}
	if err := tx.Commit(); err != nil {
		return err, !irrevocable && isBusy(err)
	}
	return nil, false
}

// isBusy reports whether err is SQLITE_BUSY or one of its extended codes (BUSY_SNAPSHOT,
// BUSY_RECOVERY, BUSY_TIMEOUT).
func isBusy(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == sqliteBusy
}

// sqliteBusy is SQLITE_BUSY, the primary result code.
const sqliteBusy = 5

// wrapBusy wraps a busy error in ErrBusy and returns any other error unchanged.
func wrapBusy(err error) error {
	if err == nil || !isBusy(err) || errors.Is(err, ErrBusy) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrBusy, err)
}
