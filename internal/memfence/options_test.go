package memfence

import (
	"errors"
	"strings"
	"testing"

	"github.com/batonhq/baton/fence"
)

// TestNewJoinsOptionErrors: New reports every problem at once, not only the first.
func TestNewJoinsOptionErrors(t *testing.T) {
	_, err := New(nil, Clock(nil))
	if !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("New = %v, want fence.ErrInvalid", err)
	}
	for _, want := range []string{"option 0 is nil", "nil clock"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("New = %q, want it to mention %q", err, want)
		}
	}
}
