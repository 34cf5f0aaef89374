package sqlitefence

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"modernc.org/sqlite"

	"github.com/batonhq/baton/fence"
)

var (
	key1 = fence.Key{Group: "g", Topic: "t", Partition: 0}
	key2 = fence.Key{Group: "g", Topic: "t", Partition: 1}
)

func tok(era, epoch int64) fence.Token { return fence.Token{Era: era, Epoch: epoch} }

func tempPath(t testing.TB) string { return filepath.Join(t.TempDir(), "fence.db") }

// pragma reads one PRAGMA on a single pooled connection.
func pragma(t *testing.T, db *sql.DB, name string) string {
	t.Helper()
	var v string
	if err := db.QueryRow("PRAGMA " + name).Scan(&v); err != nil {
		t.Fatalf("PRAGMA %s: %v", name, err)
	}
	return v
}

func TestOpenSettings(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Option
		sync string
		busy string
	}{
		{"defaults", nil, "2", "5000"},
		{"normal", []Option{SyncNormal(), BusyTimeout(250 * time.Millisecond)}, "1", "250"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openT(t, tempPath(t), tc.opts...)
			// Hold two connections at once so the settings are seen on more than the first.
			ctx := t.Context()
			c1, err := s.DB().Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer c1.Close()
			for _, c := range []struct{ pragma, want string }{
				{"journal_mode", "wal"}, {"synchronous", tc.sync}, {"foreign_keys", "1"}, {"busy_timeout", tc.busy},
			} {
				if got := pragma(t, s.DB(), c.pragma); got != c.want {
					t.Errorf("PRAGMA %s = %q, want %q", c.pragma, got, c.want)
				}
			}
		})
	}
}

// A path holding URI syntax must name exactly that file, not be cut at '?' or '#'.
func TestOpenPathIsNotAURI(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a?b#c%20d.db")
	s := openT(t, path)
	if _, err := s.Claim(t.Context(), key1, tok(0, 1), "fencetest"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("database not at %q: %v", path, err)
	}
}

// nopDriver is a database/sql driver other than modernc's.
type nopDriver struct{}

func (nopDriver) Open(string) (driver.Conn, error) { return nil, errors.New("nop") }

func init() { sql.Register("sqlitefence-nop", nopDriver{}) }

func TestBadArguments(t *testing.T) {
	other, err := sql.Open("sqlitefence-nop", "")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	plain := openPlainDB(t, tempPath(t))
	for name, f := range map[string]func() error{
		"open empty":       func() error { _, err := Open(""); return err },
		"open memory":      func() error { _, err := Open(":memory:"); return err },
		"negative busy":    func() error { _, err := Open(tempPath(t), BusyTimeout(-time.Second)); return err },
		"nil option":       func() error { _, err := Open(tempPath(t), nil); return err },
		"new nil db":       func() error { _, err := New(nil); return err },
		"new other driver": func() error { _, err := New(other); return err },
		"new sync":         func() error { _, err := New(plain, SyncNormal()); return err },
		"advance nil tx":   func() error { return openT(t, tempPath(t)).Advance(t.Context(), nil, key1, tok(0, 1), 0, 0) },
		"apply nil fn":     func() error { return openT(t, tempPath(t)).Apply(t.Context(), key1, tok(0, 1), 0, 0, nil) },
		"recover max era": func() error {
			_, err := openT(t, tempPath(t)).Recover(t.Context(), key1, tok(1<<63-1, 0), 1, "c", "r")
			return err
		},
		"admit nil tx": func() error {
			_, err := openT(t, tempPath(t)).Admit(t.Context(), nil, "s", "i", tok(0, 1), 0)
			return err
		},
		"claim invalid key": func() error {
			_, err := openT(t, tempPath(t)).Claim(t.Context(), fence.Key{}, tok(0, 1), "c")
			return err
		},
	} {
		if err := f(); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
}

// tableNames lists the tables and indexes in db.
func tableNames(t *testing.T, db *sql.DB) map[string]bool {
	t.Helper()
	rows, err := db.Query(`SELECT name FROM sqlite_schema WHERE type IN ('table', 'index') AND name NOT LIKE 'sqlite_%'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		out[n] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestTableNames(t *testing.T) {
	db := openPlainDB(t, tempPath(t), "_busy_timeout=5000")
	if _, err := db.Exec(`CREATE TABLE victim (x INTEGER)`); err != nil {
		t.Fatal(err)
	}
	before := tableNames(t, db)
	for _, name := range []string{
		``, `x"; DROP TABLE victim; --`, `victim; DROP TABLE victim`, `a b`, `1abc`, `a-b`, `a.b.c`,
		`"quoted"`, `tab` + "\x00", `naïve`, `main.`, `.t`,
		// 49 bytes: the name fits, but name+"_recoveries_idx" is 64 bytes.
		"a123456789012345678901234567890123456789012345678901"[:49],
	} {
		if _, err := New(db, Table(name)); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("Table(%q): err = %v, want ErrInvalid", name, err)
		}
	}
	if after := tableNames(t, db); len(after) != len(before) || !after["victim"] {
		t.Fatalf("a refused name changed the schema: %v -> %v", before, after)
	}

	// Valid names, reserved words and mixed case included, are quoted and kept apart.
	ctx := t.Context()
	stores := map[string]*Store{}
	for i, name := range []string{"select", "Mixed_Case", "main.qualified", "a12345678901234567890123456789012345678901234567890"[:48]} {
		s, err := New(db, Table(name))
		if err != nil {
			t.Fatalf("Table(%q): %v", name, err)
		}
		if err := s.Migrate(ctx); err != nil {
			t.Fatalf("Table(%q): migrate: %v", name, err)
		}
		if _, err := s.Claim(ctx, key1, tok(0, int64(i+1)), "fencetest"); err != nil {
			t.Fatalf("Table(%q): claim: %v", name, err)
		}
		stores[name] = s
	}
	got := tableNames(t, db)
	for _, want := range []string{"select", "select_recoveries", "select_recoveries_idx", "select_keyed", "Mixed_Case", "qualified", "qualified_recoveries_idx"} {
		if !got[want] {
			t.Errorf("table or index %q missing; have %v", want, got)
		}
	}
	for i, name := range []string{"select", "Mixed_Case", "main.qualified"} {
		st, err := stores[name].Load(ctx, key1)
		if err != nil || st.Token != tok(0, int64(i+1)) {
			t.Errorf("Table(%q): load = %v, %v; want its own token 0.%d", name, st, err, i+1)
		}
	}
}

// holdWriteLock begins a transaction on db (opened by Open, so BEGIN IMMEDIATE) and writes, so
// that it holds SQLite's write lock until the returned function commits it.
func holdWriteLock(t *testing.T, db *sql.DB) (release func()) {
	t.Helper()
	// Not t.Context(): it is cancelled before the cleanup below runs.
	tx, err := db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(`CREATE TABLE IF NOT EXISTS lockholder (x INTEGER)`); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			if err := tx.Commit(); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(release)
	return release
}

// A transaction begun on an Open store's DB takes the write lock at BEGIN: another process's
// writer is refused even before the transaction has written anything.
func TestOpenBeginsImmediate(t *testing.T) {
	path := tempPath(t)
	a := openT(t, path)
	b := openT(t, path, BusyTimeout(0))
	tx, err := a.DB().BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := b.Claim(t.Context(), key1, tok(0, 1), "fencetest"); !errors.Is(err, ErrBusy) {
		t.Fatalf("claim while another handle holds an empty transaction: err = %v, want ErrBusy", err)
	}
}

// A busy database is reported, never lost: Apply fails with ErrBusy carrying the driver's
// error, fn does not run, and nothing is committed.
func TestBusySurfaced(t *testing.T) {
	path := tempPath(t)
	a := openT(t, path)
	if _, err := a.DB().Exec(userSchema); err != nil {
		t.Fatal(err)
	}
	b := openT(t, path, BusyTimeout(20*time.Millisecond))
	ctx := t.Context()
	if _, err := b.Claim(ctx, key1, tok(0, 1), "fencetest"); err != nil {
		t.Fatal(err)
	}
	release := holdWriteLock(t, a.DB())
	called := false
	err := b.Apply(ctx, key1, tok(0, 1), 0, 0, func(ctx context.Context, tx *sql.Tx) error {
		called = true
		return writeKV(ctx, tx, "k", "v")
	})
	var se *sqlite.Error
	if !errors.Is(err, ErrBusy) || !errors.As(err, &se) {
		t.Fatalf("apply under a held lock: err = %v, want ErrBusy wrapping *sqlite.Error", err)
	}
	if called {
		t.Error("fn ran although the fence could not be advanced")
	}
	release()
	if st, err := b.Load(ctx, key1); err != nil || st.Position != fence.NoPosition {
		t.Errorf("after ErrBusy: load = %v, %v; want nothing applied", st, err)
	}
	if _, ok, err := readKV(ctx, a.DB(), "k"); err != nil || ok {
		t.Errorf("after ErrBusy: user row present = %v, %v", ok, err)
	}
}

// With a caller-owned database that has no busy_timeout, SQLite reports busy at once; the
// store retries within its own BusyTimeout, and runs fn once.
func TestBusyRetried(t *testing.T) {
	path := tempPath(t)
	a := openT(t, path)
	b, err := New(openPlainDB(t, path), BusyTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Claim(t.Context(), key1, tok(0, 1), "fencetest"); err != nil {
		t.Fatal(err)
	}
	release := holdWriteLock(t, a.DB())
	var retries atomic.Int32
	b.onBusy = func() {
		if retries.Add(1) == 2 {
			release() // let the third attempt through
		}
	}
	calls := 0
	err = b.Apply(t.Context(), key1, tok(0, 1), 0, 0, func(context.Context, *sql.Tx) error {
		calls++
		return nil
	})
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	if retries.Load() < 2 || calls != 1 {
		t.Errorf("retries = %d (want >= 2), fn calls = %d (want 1)", retries.Load(), calls)
	}
}

// The cancellation of ctx ends the wait for the lock.
func TestBusyWaitCancelled(t *testing.T) {
	path := tempPath(t)
	a := openT(t, path)
	b, err := New(openPlainDB(t, path), BusyTimeout(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	holdWriteLock(t, a.DB())
	ctx, cancel := context.WithCancel(t.Context())
	b.onBusy = cancel
	if _, err := b.Claim(ctx, key1, tok(0, 1), "fencetest"); !errors.Is(err, context.Canceled) {
		t.Fatalf("claim with ctx cancelled while busy: err = %v, want context.Canceled", err)
	}
}

// Two *sql.DB handles on one file, as two processes of an edge gateway: writers race on one
// fence while the second handle takes over with a higher epoch and the deposed writers keep
// trying, as zombies do. Every position is applied exactly once, every success is committed,
// and no write under the old epoch lands after one under the new.
func TestTwoHandlesRace(t *testing.T) {
	const raceTimeout = 15 * time.Second
	// Each epoch must commit this many positions: the takeover happens after the first
	// epoch's, and the run ends after the second's once a zombie write has been refused.
	const perOwner = 40
	path := tempPath(t)
	a := openT(t, path)
	b := openT(t, path)
	// A store that never refuses the zombie, or a writer that fails, must end the race: the
	// writers stop at the deadline or at the first error, and the test fails instead of hanging.
	ctx, cancel := context.WithTimeout(t.Context(), raceTimeout)
	defer cancel()
	if _, err := a.DB().Exec(`CREATE TABLE log (position INTEGER NOT NULL, epoch INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Claim(ctx, key1, tok(0, 1), "fencetest"); err != nil {
		t.Fatal(err)
	}

	var applied [3]atomic.Int64 // successes per epoch
	var refused atomic.Int64    // stale writes refused
	takeover, done := make(chan struct{}), make(chan struct{})
	var takeoverOnce, doneOnce sync.Once
	stop := func() { doneOnce.Do(func() { close(done) }) }
	writer := func(s *Store, epoch int64) (err error) {
		defer func() {
			if err != nil {
				stop()
			}
		}()
		for {
			select {
			case <-done:
				return nil
			case <-ctx.Done():
				return nil // reported after Wait
			default:
			}
			st, err := s.Load(ctx, key1)
			if ctx.Err() != nil {
				return nil
			}
			if err != nil {
				return err
			}
			next := st.Position + 1
			err = s.Apply(ctx, key1, tok(0, epoch), next, next, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO log (position, epoch) VALUES (?, ?)`, next, epoch)
				return err
			})
			switch {
			case err == nil:
				applied[epoch].Add(1)
			case errors.Is(err, fence.ErrStale):
				// Deposed. A consumer would stop; a zombie keeps trying, and must keep failing.
				refused.Add(1)
			case errors.Is(err, fence.ErrDuplicate), errors.Is(err, ErrBusy):
			case ctx.Err() != nil:
				return nil
			default:
				return err
			}
			if applied[1].Load() >= perOwner {
				takeoverOnce.Do(func() { close(takeover) })
			}
			if applied[2].Load() >= perOwner && refused.Load() > 0 {
				stop()
			}
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 2 {
		wg.Go(func() { errs <- writer(a, 1) })
		wg.Go(func() {
			select {
			case <-takeover:
			case <-done:
				return
			case <-ctx.Done():
				return
			}
			// SQLite's busy handler polls and is not fair: the old owner's writers, handing the
			// lock to each other inside their process, may keep the takeover out for a while.
			for {
				_, err := b.Claim(ctx, key1, tok(0, 2), "fencetest")
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					return
				}
				if !errors.Is(err, ErrBusy) {
					stop()
					errs <- err
					return
				}
			}
			errs <- writer(b, 2)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if ctx.Err() != nil {
		t.Fatalf("the race did not finish within %s: %d writes under the old epoch, %d under the new, %d stale writes refused (want %d, %d, > 0)",
			raceTimeout, applied[1].Load(), applied[2].Load(), refused.Load(), perOwner, perOwner)
	}

	rows, err := a.DB().Query(`SELECT position, epoch FROM log ORDER BY rowid`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var n, lastEpoch int64
	var perEpoch [3]int64
	for rows.Next() {
		var pos, epoch int64
		if err := rows.Scan(&pos, &epoch); err != nil {
			t.Fatal(err)
		}
		if pos != n {
			t.Fatalf("commit %d applied position %d: positions lost or applied twice", n, pos)
		}
		if epoch < lastEpoch {
			t.Fatalf("position %d committed under epoch %d after epoch %d", pos, epoch, lastEpoch)
		}
		lastEpoch = epoch
		perEpoch[epoch]++
		n++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != applied[1].Load()+applied[2].Load() {
		t.Fatalf("%d positions committed, %d Apply calls succeeded", n, applied[1].Load()+applied[2].Load())
	}
	for e := 1; e <= 2; e++ {
		if perEpoch[e] != applied[e].Load() {
			t.Errorf("epoch %d: %d Apply calls succeeded but %d rows committed", e, applied[e].Load(), perEpoch[e])
		}
	}
	if perEpoch[2] == 0 || refused.Load() == 0 {
		t.Errorf("the race did not happen: %d writes under the new epoch, %d stale writes refused", perEpoch[2], refused.Load())
	}
}

// Everything the store keeps survives closing and reopening the file.
func TestDurableAcrossReopen(t *testing.T) {
	path := tempPath(t)
	ctx := t.Context()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.DB().Exec(userSchema); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, key1, tok(0, 7), "fencetest"); err != nil {
		t.Fatal(err)
	}
	for pos := int64(0); pos < 3; pos++ {
		if err := s.Apply(ctx, key1, tok(0, 7), pos, pos, func(ctx context.Context, tx *sql.Tx) error {
			return writeKV(ctx, tx, "k", "v")
		}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Recover(ctx, key2, tok(0, 0), 3, "fencetest", "group recreated"); err != nil {
		t.Fatal(err)
	}
	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := s.Admit(ctx, tx, "orders", "o1", tok(0, 7), 4); err != nil || v != fence.Admitted {
		t.Fatalf("admit = %v, %v", v, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = openT(t, path)
	if st, err := s.Load(ctx, key1); err != nil || st != (fence.State{Token: tok(0, 7), Position: 2, Claimant: "fencetest"}) {
		t.Errorf("load after reopen = %v, %v", st, err)
	}
	if st, err := s.Load(ctx, key2); err != nil || st != (fence.State{Token: tok(1, 3), Position: fence.NoPosition, Claimant: "fencetest"}) {
		t.Errorf("recovered fence after reopen = %v, %v", st, err)
	}
	if rs, err := s.Recoveries(ctx, key2); err != nil || len(rs) != 1 || rs[0].To != tok(1, 3) || rs[0].Reason != "group recreated" {
		t.Errorf("recoveries after reopen = %v, %v", rs, err)
	}
	if v, ok, err := readKV(ctx, s.DB(), "k"); err != nil || !ok || v != "v" {
		t.Errorf("user row after reopen = %q %v %v", v, ok, err)
	}
	tx, err = s.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := s.Admit(ctx, tx, "orders", "o1", tok(0, 7), 4); err != nil || v != fence.Duplicate {
		t.Errorf("admit after reopen = %v, %v; want duplicate", v, err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(ctx, key1, tok(0, 6), 3, 3, func(context.Context, *sql.Tx) error { return nil }); !errors.Is(err, fence.ErrStale) {
		t.Errorf("stale apply after reopen: err = %v, want ErrStale", err)
	}
}

// A transaction of another database is refused, not used to write a fence into another file.
func TestForeignTransactionRefused(t *testing.T) {
	s := openT(t, tempPath(t))
	other := openPlainDB(t, tempPath(t))
	// The other file has the store's tables too, so only the check can refuse the write.
	otherStore, err := New(other)
	if err != nil {
		t.Fatal(err)
	}
	defer otherStore.Close()
	ctx := t.Context()
	if err := otherStore.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	tx, err := other.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := s.Advance(ctx, tx, key1, tok(0, 1), 0, 0); err == nil {
		t.Error("Advance accepted a transaction of another database")
	}
	if _, err := s.Admit(ctx, tx, "s", "i", tok(0, 1), 0); err == nil {
		t.Error("Admit accepted a transaction of another database")
	}
}
