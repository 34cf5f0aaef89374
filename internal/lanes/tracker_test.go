package lanes

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/batonhq/baton/fence"
)

func TestTrackerOutOfOrder(t *testing.T) {
	var tr Tracker
	if got := tr.Committable(); got != fence.NoPosition {
		t.Fatalf("empty tracker: committable %d, want fence.NoPosition", got)
	}
	// Offsets 3 and 4 never started: a gap (compaction, transaction marker) must not hold the
	// position back.
	for _, o := range []int64{0, 1, 2, 5, 9} {
		if err := tr.Start(o); err != nil {
			t.Fatalf("Start(%d): %v", o, err)
		}
	}
	steps := []struct {
		done        int64
		committable int64
		pending     int
	}{
		{1, fence.NoPosition, 5}, // 0 still running
		{5, fence.NoPosition, 5},
		{0, 1, 3}, // 0 and 1 done: 2 holds the rest
		{9, 1, 3},
		{2, 9, 0}, // the gap at 3..4 and 6..8 is skipped
	}
	for _, s := range steps {
		if err := tr.Done(s.done); err != nil {
			t.Fatalf("Done(%d): %v", s.done, err)
		}
		if got := tr.Committable(); got != s.committable {
			t.Fatalf("after Done(%d): committable %d, want %d", s.done, got, s.committable)
		}
		if got := tr.Pending(); got != s.pending {
			t.Fatalf("after Done(%d): pending %d, want %d", s.done, got, s.pending)
		}
	}
	// A later batch continues from the committed position.
	if err := tr.Start(10); err != nil {
		t.Fatal(err)
	}
	if got := tr.Committable(); got != 9 {
		t.Fatalf("after Start(10): committable %d, want 9 (it never decreases)", got)
	}
}

func TestTrackerErrors(t *testing.T) {
	var tr Tracker
	if err := tr.Start(-1); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("Start(-1) = %v, want ErrInvalid", err)
	}
	if err := tr.Done(0); !errors.Is(err, ErrUnknownOffset) {
		t.Fatalf("Done on empty tracker = %v, want ErrUnknownOffset", err)
	}
	for _, o := range []int64{4, 6} {
		if err := tr.Start(o); err != nil {
			t.Fatal(err)
		}
	}
	for _, o := range []int64{6, 5, 0} {
		if err := tr.Start(o); !errors.Is(err, ErrOffsetOrder) {
			t.Fatalf("Start(%d) after 6 = %v, want ErrOffsetOrder", o, err)
		}
	}
	if err := tr.Done(5); !errors.Is(err, ErrUnknownOffset) {
		t.Fatalf("Done(5) never started = %v, want ErrUnknownOffset", err)
	}
	if err := tr.Done(6); err != nil {
		t.Fatal(err)
	}
	if err := tr.Done(6); !errors.Is(err, ErrUnknownOffset) {
		t.Fatalf("Done(6) twice = %v, want ErrUnknownOffset", err)
	}
	if err := tr.Done(4); err != nil {
		t.Fatal(err)
	}
	if err := tr.Done(4); !errors.Is(err, ErrUnknownOffset) {
		t.Fatalf("Done(4) after it was committed = %v, want ErrUnknownOffset", err)
	}
	if got := tr.Committable(); got != 6 {
		t.Fatalf("committable %d, want 6", got)
	}
}

// model is the obvious reference: every started offset and whether it is done, scanned in full.
type model struct {
	started []int64
	done    map[int64]bool
}

func (m *model) start(o int64) bool {
	if o < 0 || (len(m.started) > 0 && o <= m.started[len(m.started)-1]) {
		return false
	}
	m.started = append(m.started, o)
	return true
}

func (m *model) finish(o int64) bool {
	if !slices.Contains(m.started, o) || m.done[o] {
		return false
	}
	m.done[o] = true
	return true
}

func (m *model) committable() (int64, int) {
	c := fence.NoPosition
	for i, o := range m.started {
		if !m.done[o] {
			return c, len(m.started) - i
		}
		c = o
	}
	return c, 0
}

// checkTrackerOps drives a Tracker and the model with the same operations decoded from ops and
// fails on the first difference.
func checkTrackerOps(t *testing.T, ops []byte) {
	var tr Tracker
	m := model{done: map[int64]bool{}}
	next := int64(0)
	for i, b := range ops {
		arg := int64(b >> 2)
		switch b & 3 {
		case 0, 1: // start the next offset after a gap of 0..3
			o := next + arg%4
			errT := tr.Start(o)
			if ok := m.start(o); ok != (errT == nil) {
				t.Fatalf("op %d Start(%d): tracker err %v, model ok %v", i, o, errT, ok)
			}
			next = o + 1
		case 2: // start an offset at or below the last (mostly invalid)
			o := next - 1 - arg%3
			errT := tr.Start(o)
			if ok := m.start(o); ok != (errT == nil) {
				t.Fatalf("op %d Start(%d): tracker err %v, model ok %v", i, o, errT, ok)
			}
			if errT == nil {
				next = o + 1
			}
		case 3: // finish some offset at or below the last started, started or not
			if next == 0 {
				continue
			}
			o := next - 1 - arg%min(next, 8)
			errT := tr.Done(o)
			if ok := m.finish(o); ok != (errT == nil) {
				t.Fatalf("op %d Done(%d): tracker err %v, model ok %v", i, o, errT, ok)
			}
		}
		wantC, wantP := m.committable()
		if got := tr.Committable(); got != wantC {
			t.Fatalf("op %d: committable %d, model %d (started %v done %v)", i, got, wantC, m.started, m.done)
		}
		if got := tr.Pending(); got != wantP {
			t.Fatalf("op %d: pending %d, model %d", i, got, wantP)
		}
	}
}

func TestTrackerMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for range 300 {
		ops := make([]byte, rng.IntN(400))
		for i := range ops {
			ops[i] = byte(rng.Uint32())
		}
		checkTrackerOps(t, ops)
	}
}

func FuzzTracker(f *testing.F) {
	f.Add([]byte{0, 0, 0, 3, 7, 11})
	f.Add([]byte{1, 5, 9, 2, 3, 255, 0, 4, 8, 3, 3, 3, 3})
	f.Fuzz(checkTrackerOps)
}
