package pgoutbox

import (
	"errors"
	"strings"
	"testing"

	"github.com/batonhq/baton/outbox"
)

// TestNewJoinsOptionErrors: New reports every problem at once, not only the first.
func TestNewJoinsOptionErrors(t *testing.T) {
	_, err := New(nil, nil, nil, Table("bad name"), MaxMessageBytes(0))
	if !errors.Is(err, outbox.ErrInvalid) {
		t.Fatalf("New = %v, want outbox.ErrInvalid", err)
	}
	for _, want := range []string{"nil DB", "nil fence store", "option 0 is nil", "table name", "MaxMessageBytes"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("New = %q, want it to mention %q", err, want)
		}
	}
}
