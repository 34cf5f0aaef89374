package sqlitefence

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"

	"github.com/batonhq/baton/fence/fencetest"
)

// userSchema is the caller's own table in the same file. Its CHECK makes a write of "fail" fail
// inside the store's transaction, as the suite requires.
const userSchema = `CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v TEXT NOT NULL CHECK (v <> 'fail'))`

func writeKV(ctx context.Context, tx *sql.Tx, key, value string) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO kv (k, v) VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v`, key, value)
	return err
}

func readKV(ctx context.Context, db *sql.DB, key string) (string, bool, error) {
	var v string
	err := db.QueryRowContext(ctx, `SELECT v FROM kv WHERE k = ?`, key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	return v, err == nil, err
}

// envFor builds the suite's Env over a store on db; reopen makes the same store again.
func envFor(t testing.TB, s *Store, reopen func(t testing.TB) *Store) fencetest.Env[*sql.Tx] {
	t.Helper()
	if _, err := s.DB().Exec(userSchema); err != nil {
		t.Fatal(err)
	}
	return fencetest.Env[*sql.Tx]{
		Sink:  s,
		Keyed: s,
		Write: writeKV,
		Read: func(ctx context.Context, key string) (string, bool, error) {
			return readKV(ctx, s.DB(), key)
		},
		Reopen: func(t testing.TB) fencetest.Env[*sql.Tx] {
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			return envFor(t, reopen(t), reopen)
		},
		Table: func(name string) error {
			s2, err := New(s.DB(), Table(name))
			if err == nil {
				err = s2.Close()
			}
			return err
		},
		Begin: func(ctx context.Context) (*sql.Tx, func() error, func() error, error) {
			tx, err := s.DB().BeginTx(ctx, nil)
			if err != nil {
				return nil, nil, nil, err
			}
			return tx, tx.Commit, tx.Rollback, nil
		},
	}
}

func openT(t testing.TB, path string, opts ...Option) *Store {
	t.Helper()
	s, err := Open(path, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestConformance runs the suite over Open: a file per case, WAL, synchronous=FULL, BEGIN
// IMMEDIATE.
func TestConformance(t *testing.T) {
	fencetest.Run(t, func(t *testing.T) fencetest.Env[*sql.Tx] {
		path := filepath.Join(t.TempDir(), "fence.db")
		open := func(t testing.TB) *Store { return openT(t, path) }
		return envFor(t, open(t), open)
	})
}

// TestConformanceNew runs the suite over New with a caller-owned database opened without
// _txlock: every transaction, the store's and the caller's, is DEFERRED. It has a busy timeout,
// which caller-held transactions need: the store cannot retry those.
func TestConformanceNew(t *testing.T) {
	fencetest.Run(t, func(t *testing.T) fencetest.Env[*sql.Tx] {
		path := filepath.Join(t.TempDir(), "fence.db")
		open := func(t testing.TB) *Store {
			db := openPlainDB(t, path, "_busy_timeout=5000")
			s, err := New(db)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Migrate(t.Context()); err != nil {
				t.Fatal(err)
			}
			return s
		}
		return envFor(t, open(t), open)
	})
}

// openPlainDB opens path with the modernc driver and WAL plus params, closing it when t ends.
func openPlainDB(t testing.TB, path string, params ...string) *sql.DB {
	t.Helper()
	dsn := "file://" + path + "?_journal_mode=WAL"
	for _, p := range params {
		dsn += "&" + p
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}
