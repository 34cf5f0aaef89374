package lincheck

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
)

func sqliteTarget(s *sqlitefence.Store) *target {
	return &target{
		claim: func(ctx context.Context, k fence.Key, t fence.Token, claimant string) (fence.State, error) {
			return s.Claim(ctx, k, t, claimant)
		},
		load: s.Load,
		apply: func(ctx context.Context, k fence.Key, t fence.Token, first, last int64) error {
			return s.Apply(ctx, k, t, first, last, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, insertDataSQLite, k.Partition, first, last, t.Era, t.Epoch)
				return err
			})
		},
		recover: func(ctx context.Context, k fence.Key, expected fence.Token, epoch int64, claimant string) (fence.Token, error) {
			return s.Recover(ctx, k, expected, epoch, claimant, "lincheck")
		},
		effect: func(_ context.Context, _ opKind, err error) (outcome, bool) {
			if errors.Is(err, sqlitefence.ErrBusy) {
				return outNoEffect, false // the write lock was never taken
			}
			// Cancelled or closed mid-call: the commit may have happened, but in this
			// process, so not after the call returned.
			return outUnknown, false
		},
	}
}

// TestSQLite: four clients on two handles of one database file, calls cancelled at random
// instants (short deadlines), and one handle closed and reopened in the middle of the run.
func TestSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fence.db")
	open := func() *sqlitefence.Store {
		s, err := sqlitefence.Open(path, sqlitefence.BusyTimeout(2*time.Second))
		if err != nil {
			t.Fatalf("open %s: %v", path, err)
		}
		return s
	}
	a, b := open(), open()
	if _, err := a.DB().Exec(createData); err != nil {
		t.Fatalf("create data table: %v", err)
	}
	var cur [2]atomic.Pointer[target]
	cur[0].Store(sqliteTarget(a))
	cur[1].Store(sqliteTarget(b))
	stores := []*sqlitefence.Store{a, b}
	defer func() {
		for _, s := range stores {
			_ = s.Close()
		}
	}()
	h := newHistory()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var next atomic.Int64
	w := workload{
		keys:     []fence.Key{{Group: "g", Topic: "t", Partition: 0}, {Group: "g", Topic: "t", Partition: 1}},
		clients:  4,
		calls:    250,
		opTimout: 2 * time.Second,
		// One call in four gets a deadline short enough to be cancelled mid-statement.
		shortEvery: 4,
		short:      time.Millisecond,
		tgt:        func() *target { return cur[next.Add(1)%2].Load() },
		pace:       time.Millisecond,
	}
	reopened := make(chan struct{})
	var after atomic.Int64 // calls recorded when the handle was reopened, 0 before
	w.more = func() bool { n := after.Load(); return n == 0 || h.len() < int(n)+300 }
	go func() {
		defer close(reopened)
		for h.len() < 300 && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		// "Restart": close handle b under the clients' feet and reopen the file.
		old := stores[1]
		_ = old.Close()
		n := open()
		stores[1] = n
		cur[1].Store(sqliteTarget(n))
		after.Store(int64(h.len()) + 1)
	}()
	w.run(ctx, h, uint64(time.Now().UnixNano()))
	<-reopened
	t.Logf("handle closed and reopened after call %d", after.Load())
	if ctx.Err() != nil {
		t.Fatalf("the workload did not finish in time: %s", h.summary())
	}
	if n := after.Load(); n == 0 || int(n) >= h.len() {
		t.Fatalf("the handle was not reopened in the middle of the run (after call %d of %d)", n, h.len())
	}
	if h.outcomes(outUnknown) == 0 {
		t.Fatalf("no call was cut off mid-statement: the fault did not happen (%s)", h.summary())
	}
	h.check(t)
	fin := stores[0]
	checkData(t, h, w.keys, func(part int32) ([]dataRow, error) {
		rows, err := fin.DB().Query(selectDataSQLite, part)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var out []dataRow
		for rows.Next() {
			var d dataRow
			if err := rows.Scan(&d.first, &d.last, &d.tok.Era, &d.tok.Epoch); err != nil {
				return nil, err
			}
			out = append(out, d)
		}
		return out, rows.Err()
	}, func(k fence.Key) (fence.State, error) { return fin.Load(context.Background(), k) })
}
