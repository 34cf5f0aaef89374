package fence

import (
	"errors"
	"strings"
	"testing"
)

var tk = Key{Group: "g", Topic: "t", Partition: 2}

func TestKey(t *testing.T) {
	if got := tk.String(); got != "g/t/2" {
		t.Fatalf("String() = %q", got)
	}
	long := strings.Repeat("x", MaxIdentifierLen)
	for _, k := range []Key{tk, {Group: long, Topic: long, Partition: 0}, {Group: "gruppe-ü", Topic: "a b/c", Partition: 1<<31 - 1}} {
		if err := k.Validate(); err != nil {
			t.Errorf("Validate(%q): %v", k, err)
		}
	}
	for name, k := range map[string]Key{
		"empty group":        {Group: "", Topic: "t"},
		"empty topic":        {Group: "g", Topic: ""},
		"negative partition": {Group: "g", Topic: "t", Partition: -1},
		"long group":         {Group: long + "x", Topic: "t"},
		"long topic":         {Group: "g", Topic: long + "x"},
		"NUL":                {Group: "g\x00", Topic: "t"},
		"NUL in the middle":  {Group: "g", Topic: "a\x00b"},
		"bad UTF-8":          {Group: "g", Topic: "\xc3"},
	} {
		if err := k.Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Validate = %v, want ErrInvalid", name, err)
		}
	}
}

func TestStateApplied(t *testing.T) {
	s := State{Token: Token{0, 1}, Position: 10}
	for pos, want := range map[int64]bool{0: true, 9: true, 10: true, 11: false, 1 << 40: false} {
		if got := s.Applied(pos); got != want {
			t.Errorf("Applied(%d) = %v, want %v", pos, got, want)
		}
	}
	if (State{Position: NoPosition}).Applied(0) {
		t.Error("a fence that applied nothing reports offset 0 as applied")
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
	if !errors.Is(se, ErrStale) || errors.Is(se, ErrRegression) {
		t.Error("StaleError does not unwrap to ErrStale alone")
	}
	if got := se.Error(); got != "fence: stale token for g/t/2: presented 0.33, stored 0.34" {
		t.Errorf("StaleError = %q", got)
	}
	re := &RegressionError{Key: tk, Stored: Token{0, 34}, Presented: Token{0, 1}}
	if !errors.Is(re, ErrRegression) || errors.Is(re, ErrStale) {
		t.Error("RegressionError does not unwrap to ErrRegression alone")
	}
	if got := re.Error(); !strings.Contains(got, "0.1") || !strings.Contains(got, "0.34") || !strings.Contains(got, "g/t/2") {
		t.Errorf("RegressionError = %q", got)
	}
}
