package fence

import (
	"errors"
	"strings"
	"testing"
)

var tk = Key{Group: "g", Topic: "t", Partition: 2}

func TestKeyString(t *testing.T) {
	if got := tk.String(); got != "g/t/2" {
		t.Fatalf("String() = %q", got)
	}
}

func TestVerdictString(t *testing.T) {
	for v, want := range map[Verdict]string{Admitted: "admitted", Duplicate: "duplicate", Stale: "stale", 0: "Verdict(0)", 9: "Verdict(9)"} {
		if got := v.String(); got != want {
			t.Errorf("Verdict(%d).String() = %q, want %q", int(v), got, want)
		}
	}
}

func TestErrors(t *testing.T) {
	se := &StaleError{Key: tk, Stored: Token{0, 34}, Presented: Token{0, 33}}
	if !errors.Is(se, ErrStale) {
		t.Error("StaleError does not unwrap to ErrStale alone")
	}
	if got := se.Error(); got != "fence: stale token for g/t/2: presented 0.33, stored 0.34" {
		t.Errorf("StaleError = %q", got)
	}
	re := &RegressionError{Key: tk, Stored: Token{0, 34}, Presented: Token{0, 1}}
	if errors.Is(re, ErrStale) {
		t.Error("RegressionError unwraps to ErrStale")
	}
	if got := re.Error(); !strings.Contains(got, "0.1") || !strings.Contains(got, "0.34") || !strings.Contains(got, "g/t/2") {
		t.Errorf("RegressionError = %q", got)
	}
}
