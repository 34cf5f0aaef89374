package consumer

import (
	"errors"
	"fmt"
	"testing"

	"github.com/batonhq/baton/fence"
)

// TestSinkVerdict: only the sink's own verdict is read from an Apply error; a fence sentinel
// inside the handler's error is the handler's, however the sink combined the two.
func TestSinkVerdict(t *testing.T) {
	stale := &fence.StaleError{Key: fence.Key{Group: "g", Topic: "t"}, Stored: fence.Token{Epoch: 2}, Presented: fence.Token{Epoch: 1}}
	handler := &handlerError{err: fmt.Errorf("my idempotency layer: %w", fence.ErrDuplicate)}
	for _, c := range []struct {
		name string
		err  error
		want error
	}{
		{"nil", nil, nil},
		{"handler's sentinel", handler, nil},
		{"wrapped handler's sentinel", fmt.Errorf("pgfence: apply: %w", handler), nil},
		{"sink's duplicate", fmt.Errorf("pgfence: %w", fence.ErrDuplicate), fence.ErrDuplicate},
		{"sink's overlap", fmt.Errorf("sqlitefence: %w: 1..50 after 30", fence.ErrOverlap), fence.ErrOverlap},
		{"sink's stale", fmt.Errorf("apply: %w", stale), stale},
		{"joined: sink's stale beside the handler's duplicate", errors.Join(handler, stale), stale},
		{"two %w: handler's first, sink's not claimed", fmt.Errorf("%w: %w", handler, fence.ErrNotClaimed), fence.ErrNotClaimed},
		{"transient", errors.New("connection reset"), nil},
	} {
		got := sinkVerdict(c.err)
		if got != c.want {
			t.Errorf("%s: sinkVerdict(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}
