package sqlitefence

import (
	"errors"
	"strings"
	"testing"

	"github.com/batonhq/baton/fence"
)

// TestNewJoinsOptionErrors: New and Open report every problem at once, not only the first.
func TestNewJoinsOptionErrors(t *testing.T) {
	_, err := New(nil, nil, Table("bad name"), BusyTimeout(-1), SyncNormal())
	if !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("New = %v, want fence.ErrInvalid", err)
	}
	for _, want := range []string{"nil *sql.DB", "option 0 is nil", "table name", "busy timeout", "SyncNormal option"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("New = %q, want it to mention %q", err, want)
		}
	}
	_, err = Open(":memory:", BusyTimeout(-1))
	for _, want := range []string{"file path", "busy timeout"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Open = %v, want it to mention %q", err, want)
		}
	}
}
