package lanes

import (
	"fmt"
	"sort"

	"github.com/batonhq/baton/fence"
)

// Tracker finds the committable position of a partition whose records complete out of order:
// the highest started offset o such that every started offset <= o is done. Offsets that were
// never started (gaps left by compaction or transaction markers) do not hold it back.
//
// The zero Tracker is ready to use. A Tracker is not safe for concurrent use: it belongs to the
// goroutine that owns the partition, and completions reach that goroutine over a channel
// (the consumer's lanes).
type Tracker struct {
	pending     []pendingOffset // started and not yet below the committable position, ascending
	head        int             // pending[:head] are consumed
	started     bool
	last        int64 // highest offset started
	committable int64 // valid when done is true
	done        bool
}

type pendingOffset struct {
	offset int64
	done   bool
}

// Start registers offset as in flight. Offsets must be started in increasing order (gaps are
// fine): an offset at or below one already started fails with [ErrOffsetOrder], a negative one
// with fence.ErrInvalid.
func (t *Tracker) Start(offset int64) error {
	if offset < 0 {
		return fmt.Errorf("%w: offset %d is negative", fence.ErrInvalid, offset)
	}
	if t.started && offset <= t.last {
		return fmt.Errorf("%w: %d started after %d", ErrOffsetOrder, offset, t.last)
	}
	t.started, t.last = true, offset
	if t.head > 0 && t.head >= len(t.pending)/2 {
		// Reclaim the consumed front so a long-lived tracker stays as large as its window.
		n := copy(t.pending, t.pending[t.head:])
		t.pending, t.head = t.pending[:n], 0
	}
	t.pending = append(t.pending, pendingOffset{offset: offset})
	return nil
}

// Done marks a started offset as complete and moves the committable position over every done
// offset at the front. An offset that is not pending (never started, or already done) fails
// with [ErrUnknownOffset] and changes nothing.
func (t *Tracker) Done(offset int64) error {
	w := t.pending[t.head:]
	i := sort.Search(len(w), func(i int) bool { return w[i].offset >= offset })
	if i == len(w) || w[i].offset != offset || w[i].done {
		return fmt.Errorf("%w: %d", ErrUnknownOffset, offset)
	}
	w[i].done = true
	for t.head < len(t.pending) && t.pending[t.head].done {
		t.committable, t.done = t.pending[t.head].offset, true
		t.head++
	}
	return nil
}

// Committable returns the highest started offset o such that every started offset <= o is
// done, or fence.NoPosition (-1: Kafka offsets start at 0) if the first started offset is not
// done yet. It never decreases.
func (t *Tracker) Committable() int64 {
	if !t.done {
		return fence.NoPosition
	}
	return t.committable
}

// Pending returns how many started offsets are above the committable position: in flight, or
// done but waiting behind one that is not.
func (t *Tracker) Pending() int { return len(t.pending) - t.head }
