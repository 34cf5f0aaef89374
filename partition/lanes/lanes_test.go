package lanes

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/partition"
)

var errBoom = errors.New("boom")

func newLanes(t *testing.T, n int) *Lanes {
	t.Helper()
	l, err := New(Count(n))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// keysOnLanes returns one key per lane, key i on lane i.
func keysOnLanes(t *testing.T, l *Lanes) [][]byte {
	t.Helper()
	keys := make([][]byte, l.Count())
	found := 0
	for i := 0; found < l.Count() && i < 100000; i++ {
		k := []byte(fmt.Sprintf("k%d", i))
		if lane := l.Lane(k); keys[lane] == nil {
			keys[lane], found = k, found+1
		}
	}
	if found < l.Count() {
		t.Fatalf("found keys for only %d of %d lanes", found, l.Count())
	}
	return keys
}

func batch(keys ...[]byte) []*kgo.Record {
	rs := make([]*kgo.Record, len(keys))
	for i, k := range keys {
		rs[i] = &kgo.Record{Topic: "t", Partition: 2, Offset: int64(100 + i), Key: k}
	}
	return rs
}

// testCtx bounds a test that would hang if lanes ran sequentially when they must not.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// awaitCancel blocks until ctx (the one Run passes to fn) is cancelled. Run is given a ctx that
// is never cancelled, so only Run's own cancellation can release it; if that never comes it
// reports the failure after a while instead of hanging.
func awaitCancel(t *testing.T, ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-time.After(20 * time.Second):
		t.Error("the ctx passed to fn was not cancelled after the batch failed")
	}
}

func TestNewLanesOptions(t *testing.T) {
	l, err := New()
	if err != nil || l.Count() != DefaultCount {
		t.Fatalf("New() = %v, %v; want %d lanes", l, err, DefaultCount)
	}
	for _, n := range []int{0, -1, MaxCount + 1} {
		if _, err := New(Count(n)); !errors.Is(err, partition.ErrInvalid) {
			t.Errorf("Count(%d): %v, want ErrInvalid", n, err)
		}
	}
	// Every problem is reported, not just the first.
	_, err = New(Count(0), nil, Count(MaxCount+1))
	if !errors.Is(err, partition.ErrInvalid) {
		t.Fatalf("bad options: %v, want ErrInvalid", err)
	}
	for _, want := range []string{"lane count 0", "option 1 is nil", fmt.Sprintf("lane count %d", MaxCount+1)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("bad options: %q does not mention %q", err, want)
		}
	}
	if l := newLanes(t, MaxCount); l.Count() != MaxCount {
		t.Fatalf("count %d", l.Count())
	}
}

func TestLaneOfKey(t *testing.T) {
	l := newLanes(t, 8)
	other := newLanes(t, 8) // a second instance maps identically
	seen := make([]int, 8)
	for i := range 10000 {
		k := []byte(fmt.Sprintf("key-%d", i))
		lane := l.Lane(k)
		if lane < 0 || lane >= 8 {
			t.Fatalf("lane %d out of range", lane)
		}
		if lane != l.Lane(slices.Clone(k)) || lane != other.Lane(k) {
			t.Fatalf("key %q: lane not deterministic", k)
		}
		seen[lane]++
	}
	for lane, n := range seen {
		if n == 0 {
			t.Fatalf("lane %d never used", lane)
		}
	}
	if got := l.Lane(nil); got != 0 {
		t.Fatalf("nil key on lane %d, want 0", got)
	}
}

// TestLaneBalance measures how evenly 100k random keys spread over the lanes (bounded loads
// cap a lane's share of slots at 1.1x the average; keys add sampling noise on top).
func TestLaneBalance(t *testing.T) {
	keys := randomKeys(100000, 3)
	for _, n := range []int{2, 4, 8, 16, 64} {
		l := newLanes(t, n)
		load := make([]int, n)
		for _, k := range keys {
			load[l.Lane(k)]++
		}
		avg := float64(len(keys)) / float64(n)
		hi, lo := float64(slices.Max(load))/avg, float64(slices.Min(load))/avg
		t.Logf("lanes=%d max/avg=%.3f min/avg=%.3f", n, hi, lo)
		if hi > 1.2 {
			t.Errorf("lanes=%d: busiest lane has %.3fx the average load, want <= 1.2", n, hi)
		}
	}
}

// TestRunPerKeyOrder runs a batch of interleaved keys and checks that each key's records ran in
// offset order, every record ran once, no more than LaneCount ran at once, and the committable
// offset is the batch's last.
func TestRunPerKeyOrder(t *testing.T) {
	for _, lanes := range []int{1, 4} {
		t.Run(fmt.Sprint("lanes=", lanes), func(t *testing.T) {
			l := newLanes(t, lanes)
			rng := rand.New(rand.NewPCG(1, uint64(lanes)))
			keys := make([][]byte, 2000)
			for i := range keys {
				if i%10 == 0 {
					continue // some records have no key
				}
				keys[i] = []byte(fmt.Sprintf("k%d", rng.IntN(40)))
			}
			rs := batch(keys...)
			var (
				mu          sync.Mutex
				seen        = map[string][]int64{}
				inFlight    atomic.Int32
				maxInFlight atomic.Int32
			)
			got, err := l.Run(testCtx(t), rs, func(ctx context.Context, r *kgo.Record) error {
				n := inFlight.Add(1)
				defer inFlight.Add(-1)
				for m := maxInFlight.Load(); n > m && !maxInFlight.CompareAndSwap(m, n); m = maxInFlight.Load() {
				}
				if r.Offset%7 == 0 {
					time.Sleep(10 * time.Microsecond) // let lanes interleave
				}
				k := "<nil>"
				if r.Key != nil {
					k = string(r.Key)
				}
				mu.Lock()
				seen[k] = append(seen[k], r.Offset)
				mu.Unlock()
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if want := rs[len(rs)-1].Offset; got != want {
				t.Fatalf("committable %d, want %d", got, want)
			}
			total := 0
			for k, offs := range seen {
				if !slices.IsSorted(offs) {
					t.Fatalf("key %s ran out of order: %v", k, offs)
				}
				total += len(offs)
			}
			if total != len(rs) {
				t.Fatalf("%d calls for %d records", total, len(rs))
			}
			if m := maxInFlight.Load(); m > int32(lanes) {
				t.Fatalf("%d records ran at once with %d lanes", m, lanes)
			}
		})
	}
}

// TestRunKeysInParallel proves different keys run at the same time: each record waits until
// every lane has a record in fn, which never happens if lanes run one after another.
func TestRunKeysInParallel(t *testing.T) {
	l := newLanes(t, 4)
	keys := keysOnLanes(t, l)
	var started sync.WaitGroup
	started.Add(len(keys))
	all := make(chan struct{})
	go func() { started.Wait(); close(all) }()
	got, err := l.Run(testCtx(t), batch(keys...), func(ctx context.Context, r *kgo.Record) error {
		started.Done()
		select {
		case <-all:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	if err != nil {
		t.Fatalf("lanes did not run in parallel: %v", err)
	}
	if got != 103 {
		t.Fatalf("committable %d, want 103", got)
	}
}

// TestRunFirstErrorStopsLanes: the failing record is the first on its lane; every other lane
// is inside its first record when the failure comes, blocks there until the failure cancels
// ctx, returns nil, and must then stop before its next record.
func TestRunFirstErrorStopsLanes(t *testing.T) {
	l := newLanes(t, 4)
	k := keysOnLanes(t, l)
	// Offsets 100..: lane 0 fails; lanes 1-3 each have two records.
	rs := batch(k[1], k[2], k[3], k[0], k[1], k[2], k[3])
	var calls sync.Map
	var others sync.WaitGroup
	others.Add(3)
	got, err := l.Run(context.Background(), rs, func(ctx context.Context, r *kgo.Record) error {
		calls.Store(r.Offset, true)
		if r.Offset == 103 {
			others.Wait()
			return errBoom
		}
		if r.Offset < 103 {
			others.Done()
		}
		awaitCancel(t, ctx)
		return nil
	})
	if !errors.Is(err, errBoom) {
		t.Fatalf("err %v, want the first failure (boom), not a later cancellation", err)
	}
	var re *partition.RecordError
	if !errors.As(err, &re) || re.Offset != 103 || re.ID != (partition.ID{Topic: "t", Partition: 2}) || string(re.Key) != string(k[0]) {
		t.Fatalf("err %#v does not name the failing record", err)
	}
	for _, o := range []int64{104, 105, 106} {
		if _, ok := calls.Load(o); ok {
			t.Fatalf("offset %d ran after the batch failed", o)
		}
	}
	// 100..102 completed (after the cancel); 103 failed, so the prefix ends at 102.
	if got != 102 {
		t.Fatalf("committable %d, want 102", got)
	}
}

// TestRunCommittableIsContiguousPrefix: a record after the failure completes on another lane,
// but the committable offset stops below the failure.
func TestRunCommittableIsContiguousPrefix(t *testing.T) {
	l := newLanes(t, 2)
	k := keysOnLanes(t, l)
	a, b := k[0], k[1]
	rs := batch(a, a, b, a, b, b) // 100..105
	bRan := make(chan struct{})
	var ran sync.Map
	got, err := l.Run(context.Background(), rs, func(ctx context.Context, r *kgo.Record) error {
		ran.Store(r.Offset, true)
		switch r.Offset {
		case 102:
			close(bRan)
		case 103:
			<-bRan // fail only after lane b ran 102
			return errBoom
		case 104:
			awaitCancel(t, ctx) // completes, but after the failure
		}
		return nil
	})
	if !errors.Is(err, errBoom) {
		t.Fatalf("err %v, want boom", err)
	}
	if _, ok := ran.Load(int64(104)); !ok {
		t.Fatal("104 did not run")
	}
	if _, ok := ran.Load(int64(105)); ok {
		t.Fatal("105 ran after the failure")
	}
	if got != 102 {
		t.Fatalf("committable %d, want 102 (104 completed but 103 failed)", got)
	}
}

func TestRunSequentialError(t *testing.T) {
	l := newLanes(t, 1)
	calls := 0
	got, err := l.Run(testCtx(t), batch([]byte("a"), []byte("b"), []byte("c"), []byte("d")), func(ctx context.Context, r *kgo.Record) error {
		calls++
		if r.Offset == 102 {
			return errBoom
		}
		return nil
	})
	if !errors.Is(err, errBoom) || got != 101 || calls != 3 {
		t.Fatalf("Run = %d, %v after %d calls; want 101, boom, 3", got, err, calls)
	}
}

func TestRunCancelled(t *testing.T) {
	cause := errors.New("partition revoked")
	for _, lanes := range []int{1, 4} {
		l := newLanes(t, lanes)
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(cause)
		called := false
		got, err := l.Run(ctx, batch([]byte("a"), []byte("b"), []byte("c"), nil), func(context.Context, *kgo.Record) error {
			called = true
			return nil
		})
		if !errors.Is(err, cause) || got != fence.NoPosition || called {
			t.Fatalf("lanes=%d: Run = %d, %v, called %v; want fence.NoPosition, the cause, not called", lanes, got, err, called)
		}
	}
}

// TestRunCancelledMidBatch: the caller cancels while the batch runs and fn ignores ctx; Run
// reports the cancellation because records were left undone.
func TestRunCancelledMidBatch(t *testing.T) {
	l := newLanes(t, 4)
	k := keysOnLanes(t, l)
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	got, err := l.Run(ctx, batch(k[0], k[1], k[0], k[1]), func(_ context.Context, r *kgo.Record) error {
		if r.Offset == 100 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	if got >= 102 {
		t.Fatalf("committable %d: 102 cannot have run after the cancel", got)
	}
}

func TestRunInvalid(t *testing.T) {
	l := newLanes(t, 4)
	ok := func(context.Context, *kgo.Record) error { t.Fatal("fn called on an invalid batch"); return nil }
	mixed := batch([]byte("a"), []byte("b"))
	mixed[1].Partition = 3
	dup := batch([]byte("a"), []byte("b"))
	dup[1].Offset = dup[0].Offset
	neg := batch([]byte("a"))
	neg[0].Offset = -1
	for name, tc := range map[string]struct {
		rs []*kgo.Record
		fn func(context.Context, *kgo.Record) error
	}{
		"nil fn":       {batch([]byte("a")), nil},
		"nil record":   {[]*kgo.Record{nil}, ok},
		"mixed":        {mixed, ok},
		"not rising":   {dup, ok},
		"negative off": {neg, ok},
	} {
		if got, err := l.Run(context.Background(), tc.rs, tc.fn); !errors.Is(err, partition.ErrInvalid) || got != fence.NoPosition {
			t.Errorf("%s: Run = %d, %v; want fence.NoPosition, ErrInvalid", name, got, err)
		}
	}
	if got, err := l.Run(context.Background(), nil, ok); err != nil || got != fence.NoPosition {
		t.Fatalf("empty batch: Run = %d, %v; want fence.NoPosition, nil", got, err)
	}
}

func BenchmarkLanesRun(b *testing.B) {
	keys := randomKeys(1000, 5)
	rs := batch(keys...)
	for _, n := range []int{1, 4} {
		l, err := New(Count(n))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprint("lanes=", n), func(b *testing.B) {
			for b.Loop() {
				if _, err := l.Run(context.Background(), rs, func(context.Context, *kgo.Record) error { return nil }); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(rs)), "ns/record")
		})
	}
}
