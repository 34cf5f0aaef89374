package pgfence

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

var (
	_ DB = (*pgxpool.Pool)(nil)
	_ DB = (*pgx.Conn)(nil)
	_ DB = pgx.Tx(nil)
)

// newStore opens a store on a fresh schema, migrated, with a user table kv whose CHECK
// makes a write of "fail" fail.
func newStore(t testing.TB, opts ...Option) (*Store, *pgxpool.Pool) {
	t.Helper()
	s, pool, _ := newStoreSchema(t, opts...)
	return s, pool
}

// newStoreSchema is newStore that also returns the schema.
func newStoreSchema(t testing.TB, opts ...Option) (*Store, *pgxpool.Pool, string) {
	t.Helper()
	pool, schema := testenv.Postgres(t)
	ctx := testenv.Context(t, time.Minute)
	s, err := New(pool, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE kv (k text PRIMARY KEY, v text NOT NULL CHECK (v <> 'fail'))`); err != nil {
		t.Fatalf("create kv: %v", err)
	}
	return s, pool, schema
}

const upsertKV = `INSERT INTO kv (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v`

func writeKV(ctx context.Context, tx pgx.Tx, k, v string) error {
	_, err := tx.Exec(ctx, upsertKV, k, v)
	return err
}

func readKV(t testing.TB, pool *pgxpool.Pool, k string) (string, bool) {
	t.Helper()
	var v string
	err := pool.QueryRow(context.Background(), `SELECT v FROM kv WHERE k = $1`, k).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false
	}
	if err != nil {
		t.Fatalf("read kv %s: %v", k, err)
	}
	return v, true
}

func mustState(t testing.TB, s *Store, k fence.Key, want fence.State) {
	t.Helper()
	got, err := s.Load(context.Background(), k)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if got != want {
		t.Fatalf("stored state %+v, want %+v", got, want)
	}
}

func TestNewRefusesInvalidNames(t *testing.T) {
	var db *pgxpool.Pool // New does no I/O
	for _, o := range []Option{
		Table(""), Table(`x"; DROP TABLE kv; --`), Table("kv; DROP TABLE kv"), Table("a.b.c"),
		Table("1abc"), Table(`"quoted"`), Table("t\x00"), Table(strings.Repeat("t", 64)),
		Table(strings.Repeat("t", 60)), // its derived "_recoveries" table is too long
	} {
		if _, err := New(db, o); !errors.Is(err, fence.ErrInvalid) {
			var c config
			o(&c)
			t.Errorf("New(%+v) = %v, want ErrInvalid", c, err)
		}
	}
	if _, err := New(nil); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("New(nil) = %v, want ErrInvalid", err)
	}
	for _, o := range []Option{Table("f"), Table("Fences"), Table("s.f"), Table("select")} {
		if _, err := New(db, o); err != nil {
			t.Errorf("New: %v", err)
		}
	}
}

// Names are quoted, so mixed case and reserved words reach the catalog exactly as given.
func TestQuotedAndQualifiedNames(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	pool, schema := testenv.Postgres(t)
	if _, err := pool.Exec(ctx, `CREATE SCHEMA "Other_`+schema+`"`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA "Other_`+schema+`" CASCADE`) })
	for _, name := range []string{"Select", "Other_" + schema + ".Fences"} {
		s, err := New(pool, Table(name))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(ctx); err != nil {
			t.Fatalf("Migrate %s: %v", name, err)
		}
		k := fence.Key{Group: "g", Topic: name, Partition: 0}
		if _, err := s.Claim(ctx, k, fence.Token{Epoch: 1}, "fencetest"); err != nil {
			t.Fatalf("Claim on %s: %v", name, err)
		}
		var n int
		sch, tbl, ok := strings.Cut(name, ".")
		if !ok {
			sch, tbl = schema, name
		}
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = ANY($2)`,
			sch, []string{tbl, tbl + "_recoveries", tbl + "_keyed"}).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 3 {
			t.Fatalf("%d tables named %s in %s, want 3", n, tbl, sch)
		}
	}
}

// Concurrent CREATE TABLE IF NOT EXISTS of one table fails without the advisory lock
// (duplicate key on pg_type); many rounds in fresh schemas make that race likely.
func TestMigrateTwiceAndConcurrently(t *testing.T) {
	ctx := testenv.Context(t, 2*time.Minute)
	pool, schema := testenv.Postgres(t)
	const rounds, workers = 10, 6
	for r := range rounds {
		sch := fmt.Sprintf("%s_m%d", schema, r)
		if _, err := pool.Exec(ctx, `CREATE SCHEMA `+sch); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA `+sch+` CASCADE`) })
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for range workers {
			wg.Go(func() {
				s, err := New(pool, Table(sch+".fences"))
				if err == nil {
					err = s.Migrate(ctx)
				}
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("round %d: concurrent Migrate: %v", r, err)
			}
		}
	}
	s, err := New(pool)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := s.Migrate(ctx); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
	}
}

func TestClaimAndLoad(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	s, _ := newStore(t)
	k := fence.Key{Group: "g", Topic: "t", Partition: 3}
	mustState(t, s, k, fence.State{Position: fence.NoPosition})

	if _, err := s.Claim(ctx, k, fence.Token{Era: 1, Epoch: 1}, "fencetest"); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("claim of an invented era on a new fence: %v, want ErrInvalid", err)
	}
	mustState(t, s, k, fence.State{Position: fence.NoPosition}) // and nothing was inserted
	st, err := s.Claim(ctx, k, fence.Token{Epoch: 5}, "fencetest")
	if err != nil || st != (fence.State{Token: fence.Token{Epoch: 5}, Position: fence.NoPosition, Claimant: "fencetest"}) {
		t.Fatalf("Claim = %+v, %v", st, err)
	}
	if err := s.Apply(ctx, k, fence.Token{Epoch: 5}, 10, 10, func(context.Context, pgx.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	// A later claim keeps the position: it is where the new owner resumes.
	st, err = s.Claim(ctx, k, fence.Token{Epoch: 7}, "fencetest")
	if err != nil || st != (fence.State{Token: fence.Token{Epoch: 7}, Position: 10, Claimant: "fencetest"}) {
		t.Fatalf("Claim = %+v, %v", st, err)
	}
	if st, err = s.Claim(ctx, k, fence.Token{Epoch: 7}, "fencetest"); err != nil || st.Token.Epoch != 7 {
		t.Fatalf("re-claim with the same token = %+v, %v", st, err)
	}
	_, err = s.Claim(ctx, k, fence.Token{Epoch: 6}, "fencetest")
	var se *fence.StaleError
	if !errors.As(err, &se) || se.Stored != (fence.Token{Epoch: 7}) || se.Presented != (fence.Token{Epoch: 6}) || se.Key != k {
		t.Fatalf("lower claim: %v, want StaleError stored 0.7", err)
	}
	if _, err := s.Claim(ctx, k, fence.Token{Era: 1, Epoch: 1}, "fencetest"); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("claim of an invented era: %v, want ErrInvalid", err)
	}
	// The same token held by another claimant is refused, atomically in the claim statement.
	_, err = s.Claim(ctx, k, fence.Token{Epoch: 7}, "other")
	if !errors.As(err, &se) || se.Stored != (fence.Token{Epoch: 7}) || se.Presented != (fence.Token{Epoch: 7}) {
		t.Fatalf("equal claim by another claimant: %v, want StaleError", err)
	}
	mustState(t, s, k, fence.State{Token: fence.Token{Epoch: 7}, Position: 10, Claimant: "fencetest"})
}

// A fence table created before the claimant column existed is upgraded by Migrate, and its
// rows hold their token for nobody.
func TestMigrateAddsClaimant(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	s, pool := newStore(t)
	k := fence.Key{Group: "g", Topic: "legacy", Partition: 0}
	if _, err := pool.Exec(ctx, `ALTER TABLE baton_fences DROP COLUMN claimant`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO baton_fences (group_id, topic, partition, era, epoch, position) VALUES ('g', 'legacy', 0, 0, 5, 9)`); err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	mustState(t, s, k, fence.State{Token: fence.Token{Epoch: 5}, Position: 9})
	if _, err := s.Claim(ctx, k, fence.Token{Epoch: 5}, "c"); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("equal claim of a legacy row: %v, want stale (nobody can prove it held it)", err)
	}
	if st, err := s.Claim(ctx, k, fence.Token{Epoch: 6}, "c"); err != nil || st.Position != 9 {
		t.Fatalf("higher claim of a legacy row = %+v, %v", st, err)
	}
}

func TestApplyClassifies(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	s, pool := newStore(t)
	k := fence.Key{Group: "g", Topic: "t", Partition: 0}
	tok := fence.Token{Epoch: 2}
	if _, err := s.Claim(ctx, k, tok, "fencetest"); err != nil {
		t.Fatal(err)
	}
	write := func(v string) func(context.Context, pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error { return writeKV(ctx, tx, "a", v) }
	}
	if err := s.Apply(ctx, k, tok, 5, 5, write("1")); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(ctx, k, tok, 5, 5, write("dup")); !errors.Is(err, fence.ErrDuplicate) {
		t.Fatalf("same position: %v, want ErrDuplicate", err)
	}
	if err := s.Apply(ctx, k, tok, 4, 4, write("dup")); !errors.Is(err, fence.ErrDuplicate) {
		t.Fatalf("lower position: %v, want ErrDuplicate", err)
	}
	if err := s.Apply(ctx, k, fence.Token{Epoch: 1}, 9, 9, write("stale")); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("lower token: %v, want ErrStale", err)
	}
	if err := s.Apply(ctx, k, tok, 6, 6, write("fail")); err == nil {
		t.Fatal("a failing user write committed")
	}
	mustState(t, s, k, fence.State{Token: tok, Position: 5, Claimant: "fencetest"}) // the failed write did not advance
	if v, _ := readKV(t, pool, "a"); v != "1" {
		t.Fatalf("kv a = %q, want 1", v)
	}
	// A higher epoch is not claimed: refused, nothing changes; claimed, it writes.
	if err := s.Apply(ctx, k, fence.Token{Epoch: 3}, 6, 6, write("3")); !errors.Is(err, fence.ErrNotClaimed) {
		t.Fatalf("unclaimed higher token: %v, want ErrNotClaimed", err)
	}
	if _, err := s.Claim(ctx, k, fence.Token{Epoch: 3}, "fencetest"); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(ctx, k, fence.Token{Epoch: 3}, 1, 6, write("3")); !errors.Is(err, fence.ErrOverlap) {
		t.Fatalf("batch spanning the stored position: %v, want ErrOverlap", err)
	}
	if err := s.Apply(ctx, k, fence.Token{Epoch: 3}, 6, 6, write("3")); err != nil {
		t.Fatal(err)
	}
	mustState(t, s, k, fence.State{Token: fence.Token{Epoch: 3}, Position: 6, Claimant: "fencetest"})
	if err := s.Apply(ctx, k, fence.Token{Era: 1, Epoch: 3}, 7, 7, write("x")); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("invented era: %v, want ErrInvalid", err)
	}
	if err := s.Apply(ctx, fence.Key{Group: "g", Topic: "new", Partition: 0}, fence.Token{Era: 2}, 0, 0, write("x")); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("invented era on a new fence: %v, want ErrInvalid", err)
	}
	if v, _ := readKV(t, pool, "a"); v != "3" {
		t.Fatalf("kv a = %q, want 3", v)
	}
}

func TestApplyBatchPipelined(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	s, pool := newStore(t)
	k := fence.Key{Group: "g", Topic: "t", Partition: 1}
	tok := fence.Token{Epoch: 4}
	if _, err := s.Claim(ctx, k, tok, "fencetest"); err != nil {
		t.Fatal(err)
	}
	queue := func(vals ...string) func(*pgx.Batch) error {
		return func(b *pgx.Batch) error {
			for i, v := range vals {
				b.Queue(upsertKV, fmt.Sprintf("k%d", i), v)
			}
			return nil
		}
	}
	// The fence is the first statement of the batch the caller's statements are in.
	var sent *pgx.Batch
	err := s.ApplyBatch(ctx, k, tok, 100, 100, func(b *pgx.Batch) error {
		sent = b
		return queue("a", "b", "c")(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := sent.Len(); n != 4 || sent.QueuedQueries[0].SQL != s.sqlAdvance {
		t.Fatalf("batch of %d statements, first %q; want the fence then 3", n, sent.QueuedQueries[0].SQL)
	}
	mustState(t, s, k, fence.State{Token: tok, Position: 100, Claimant: "fencetest"})
	for i, want := range []string{"a", "b", "c"} {
		if v, _ := readKV(t, pool, fmt.Sprintf("k%d", i)); v != want {
			t.Fatalf("k%d = %q, want %q", i, v, want)
		}
	}
	// Refused batches roll back the caller's statements, which did run.
	var ran bool
	dup := func(b *pgx.Batch) error {
		b.Queue(upsertKV, "k0", "dup").Exec(func(pgconn.CommandTag) error { ran = true; return nil })
		return nil
	}
	if err := s.ApplyBatch(ctx, k, tok, 100, 100, dup); !errors.Is(err, fence.ErrDuplicate) {
		t.Fatalf("replayed batch: %v, want ErrDuplicate", err)
	}
	if !ran {
		t.Fatal("the caller's statement's callback did not run")
	}
	err = s.ApplyBatch(ctx, k, fence.Token{Epoch: 3}, 200, 200, queue("stale"))
	var se *fence.StaleError
	if !errors.As(err, &se) || se.Stored != tok {
		t.Fatalf("lower token: %v, want StaleError stored %s", err, tok)
	}
	// A refused fence is reported even when a caller's statement failed too.
	if err := s.ApplyBatch(ctx, k, fence.Token{Epoch: 3}, 200, 200, queue("fail")); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("lower token and failing write: %v, want ErrStale", err)
	}
	// A failing caller statement rolls back the fence.
	if err := s.ApplyBatch(ctx, k, tok, 101, 101, queue("x", "fail")); err == nil || errors.Is(err, fence.ErrStale) {
		t.Fatalf("failing write: %v, want the write's error", err)
	}
	fnErr := errors.New("fn")
	if err := s.ApplyBatch(ctx, k, tok, 101, 101, func(*pgx.Batch) error { return fnErr }); !errors.Is(err, fnErr) {
		t.Fatalf("fn error: %v", err)
	}
	mustState(t, s, k, fence.State{Token: tok, Position: 100, Claimant: "fencetest"})
	if v, _ := readKV(t, pool, "k0"); v != "a" {
		t.Fatalf("k0 = %q, want a", v)
	}
	// And a caller-owned transaction can use the pipelined advance directly.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := s.AdvanceBatch(ctx, tx, k, tok, 150, 150, queue("own")); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	mustState(t, s, k, fence.State{Token: tok, Position: 150, Claimant: "fencetest"})
	if v, _ := readKV(t, pool, "k0"); v != "own" {
		t.Fatalf("k0 = %q, want own", v)
	}
}

// TestAdvanceRace is the READ COMMITTED argument run against the server: writer A advances
// over 10 and holds the row lock; writer B (a batch 5..20 under the same token, which the
// committed state before A would admit) blocks on that lock, and once A commits re-evaluates
// its WHERE on A's row version and is refused as an overlap.
func TestAdvanceRace(t *testing.T) {
	for _, pipelined := range []bool{false, true} {
		t.Run(fmt.Sprintf("pipelined=%v", pipelined), func(t *testing.T) {
			// Seconds, not minutes: a writer that never blocks or never wakes fails fast.
			ctx := testenv.Context(t, 15*time.Second)
			s, pool := newStore(t)
			k := fence.Key{Group: "g", Topic: "t", Partition: 0}
			low := fence.Token{Epoch: 1}
			if _, err := s.Claim(ctx, k, low, "fencetest"); err != nil {
				t.Fatal(err)
			}
			txA, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = txA.Rollback(ctx) }()
			if err := s.Advance(ctx, txA, k, low, 10, 10); err != nil {
				t.Fatal(err)
			}
			if err := writeKV(ctx, txA, "x", "A"); err != nil {
				t.Fatal(err)
			}

			txB, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = txB.Rollback(ctx) }()
			var pidB uint32
			if err := txB.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pidB); err != nil {
				t.Fatal(err)
			}
			errB := make(chan error, 1)
			go func() {
				if pipelined {
					errB <- s.AdvanceBatch(ctx, txB, k, low, 5, 20, func(b *pgx.Batch) error {
						b.Queue(upsertKV, "x", "B")
						return nil
					})
					return
				}
				err := s.Advance(ctx, txB, k, low, 5, 20)
				if err == nil {
					err = writeKV(ctx, txB, "x", "B")
				}
				errB <- err
			}()
			// Prove B reached the server and waits for A's row lock.
			for {
				var waiting bool
				err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted)`, pidB).Scan(&waiting)
				if err != nil {
					t.Fatalf("waiting for B to block (did it not take the lock?): %v", err)
				}
				if waiting {
					break
				}
				select {
				case err := <-errB:
					t.Fatalf("B finished without waiting for A's lock: %v", err)
				case <-time.After(10 * time.Millisecond):
				}
			}
			if err := txA.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-errB; !errors.Is(err, fence.ErrOverlap) {
				t.Fatalf("B after A committed: %v, want ErrOverlap", err)
			}
			_ = txB.Rollback(ctx)
			mustState(t, s, k, fence.State{Token: low, Position: 10, Claimant: "fencetest"})
			if v, _ := readKV(t, pool, "x"); v != "A" {
				t.Fatalf("x = %q, want A", v)
			}
		})
	}
}

func TestRecover(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	s, _ := newStore(t)
	k := fence.Key{Group: "g", Topic: "t", Partition: 2}
	if _, err := s.Recover(ctx, k, fence.Token{Epoch: 3}, 1, "fencetest", "r"); !errors.Is(err, fence.ErrConflict) {
		t.Fatalf("recover a missing fence from 0.3: %v, want ErrConflict", err)
	}
	mustState(t, s, k, fence.State{Position: fence.NoPosition})
	if _, err := s.Claim(ctx, k, fence.Token{Epoch: 9}, "fencetest"); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(ctx, k, fence.Token{Epoch: 9}, 41, 41, func(context.Context, pgx.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recover(ctx, k, fence.Token{Epoch: 8}, 1, "fencetest", "r"); !errors.Is(err, fence.ErrConflict) {
		t.Fatalf("recover with the wrong expectation: %v, want ErrConflict", err)
	}
	to, err := s.Recover(ctx, k, fence.Token{Epoch: 9}, 1, "fencetest", "group recreated")
	if err != nil || to != (fence.Token{Era: 1, Epoch: 1}) {
		t.Fatalf("Recover = %s, %v", to, err)
	}
	mustState(t, s, k, fence.State{Token: to, Position: 41, Claimant: "fencetest"}) // the position survives
	if _, err := s.Recover(ctx, k, fence.Token{Epoch: 9}, 1, "fencetest", "again"); !errors.Is(err, fence.ErrConflict) {
		t.Fatalf("second recover from the same token: %v, want ErrConflict", err)
	}
	if _, err := s.Claim(ctx, k, fence.Token{Epoch: 10}, "fencetest"); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("claim of the old era after recover: %v, want ErrStale", err)
	}
	if _, err := s.Claim(ctx, k, fence.Token{Era: 1, Epoch: 2}, "fencetest"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recover(ctx, k, fence.Token{Era: 1, Epoch: 2}, 0, "fencetest", "twice"); err != nil {
		t.Fatal(err)
	}
	k2 := fence.Key{Group: "g", Topic: "t2", Partition: 0}
	if to, err := s.Recover(ctx, k2, fence.Token{}, 4, "fencetest", "new"); err != nil || to != (fence.Token{Era: 1, Epoch: 4}) {
		t.Fatalf("recover a missing fence from the zero token = %s, %v", to, err)
	}
	if _, err := s.Recover(ctx, k, fence.Token{Era: 2}, 1, "fencetest", ""); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("empty reason: %v", err)
	}
	rs, err := s.Recoveries(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 {
		t.Fatalf("%d recoveries, want 2: %+v", len(rs), rs)
	}
	want := []fence.Recovery{
		{Key: k, From: fence.Token{Epoch: 9}, To: fence.Token{Era: 1, Epoch: 1}, Reason: "group recreated"},
		{Key: k, From: fence.Token{Era: 1, Epoch: 2}, To: fence.Token{Era: 2, Epoch: 0}, Reason: "twice"},
	}
	for i, r := range rs {
		if r.At.IsZero() {
			t.Errorf("recovery %d has no time", i)
		}
		r.At = time.Time{}
		if r != want[i] {
			t.Errorf("recovery %d = %+v, want %+v", i, r, want[i])
		}
	}
}

func TestAdmit(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	s, pool := newStore(t)
	admit := func(scope, id string, tok fence.Token, seq int64) fence.Verdict {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		v, err := s.Admit(ctx, tx, scope, id, tok, seq)
		if err != nil {
			t.Fatalf("Admit: %v", err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return v
	}
	steps := []struct {
		id   string
		tok  fence.Token
		seq  int64
		want fence.Verdict
	}{
		{"a", fence.Token{Epoch: 2}, 5, fence.Admitted},
		{"a", fence.Token{Epoch: 2}, 5, fence.Duplicate},
		{"a", fence.Token{Epoch: 2}, 4, fence.Duplicate},
		{"a", fence.Token{Epoch: 1}, 9, fence.Stale},
		{"a", fence.Token{Epoch: 2}, 6, fence.Admitted},
		{"a", fence.Token{Epoch: 3}, 0, fence.Admitted}, // a higher token restarts the sequence
		{"a", fence.Token{Epoch: 2}, 7, fence.Stale},
		{"a", fence.Token{Era: 1}, 0, fence.Admitted},
		{"b", fence.Token{}, 0, fence.Admitted}, // ids are independent
	}
	for i, st := range steps {
		if v := admit("s", st.id, st.tok, st.seq); v != st.want {
			t.Fatalf("step %d: Admit(%s, %s, %d) = %s, want %s", i, st.id, st.tok, st.seq, v, st.want)
		}
	}
	if v := admit("other", "a", fence.Token{}, 0); v != fence.Admitted {
		t.Fatalf("scopes are independent: %s", v)
	}
	// A rolled-back admission stores nothing.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	v, err := s.Admit(ctx, tx, "s", "c", fence.Token{Epoch: 1}, 1)
	_ = tx.Rollback(ctx) // before any Fatal: an open transaction would hold the pool's Close
	if err != nil || v != fence.Admitted {
		t.Fatalf("Admit = %s, %v", v, err)
	}
	if v := admit("s", "c", fence.Token{Epoch: 1}, 1); v != fence.Admitted {
		t.Fatalf("after rollback: %s, want admitted", v)
	}
	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := s.Admit(ctx, tx, "", "c", fence.Token{}, 1); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("empty scope: %v", err)
	}
}

// commitTx is a fake pgx.Tx whose Commit returns a chosen error.
type commitTx struct {
	pgx.Tx
	err error
}

func (c commitTx) Commit(context.Context) error { return c.err }

type safeErr struct{}

func (safeErr) Error() string     { return "not sent" }
func (safeErr) SafeToRetry() bool { return true }

func TestCommitOutcome(t *testing.T) {
	k := fence.Key{Group: "g", Topic: "t"}
	for _, c := range []struct {
		err     error
		unknown bool
	}{
		{nil, false},
		{&pgconn.PgError{Code: "40001"}, false},
		{pgx.ErrTxCommitRollback, false},
		{fmt.Errorf("wrapped: %w", safeErr{}), false},
		{io.ErrUnexpectedEOF, true},
		{context.DeadlineExceeded, true},
	} {
		err := commit(context.Background(), commitTx{err: c.err}, k)
		if (err == nil) != (c.err == nil) || errors.Is(err, ErrCommitUnknown) != c.unknown {
			t.Errorf("commit failing with %v: %v, want unknown=%v", c.err, err, c.unknown)
		}
		if c.err != nil && !errors.Is(err, c.err) {
			t.Errorf("commit error %v does not wrap %v", err, c.err)
		}
	}
}
