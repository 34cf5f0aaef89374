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

func TestCheckClaim(t *testing.T) {
	tests := []struct {
		stored, presented Token
		want              error // nil, ErrStale or ErrInvalid
	}{
		{Token{}, Token{}, nil},
		{Token{}, Token{0, 5}, nil},
		{Token{0, 5}, Token{0, 5}, nil}, // equal: the same owner claims again
		{Token{0, 5}, Token{0, 6}, nil},
		{Token{0, 5}, Token{0, 4}, ErrStale},
		{Token{0, 5}, Token{}, ErrStale},
		{Token{1, 2}, Token{0, 99}, ErrStale}, // an old era, however high its epoch
		{Token{1, 2}, Token{1, 3}, nil},
		{Token{0, 5}, Token{1, 0}, ErrInvalid}, // a later era comes only from Recover
		{Token{1, 5}, Token{3, 5}, ErrInvalid},
	}
	for _, tt := range tests {
		s := State{Token: tt.stored, Position: 7}
		err := CheckClaim(tk, s, tt.presented)
		checkErr(t, "CheckClaim", tt.stored, tt.presented, err, tt.want)
	}
}

func TestCheckAdvance(t *testing.T) {
	s := State{Token: Token{0, 5}, Position: 10}
	tests := []struct {
		tok  Token
		pos  int64
		want error
	}{
		{Token{0, 5}, 11, nil},
		{Token{0, 5}, 1 << 50, nil}, // gaps are fine
		{Token{0, 6}, 11, nil},
		{Token{0, 5}, 10, ErrDuplicate},
		{Token{0, 5}, 0, ErrDuplicate},
		{Token{0, 6}, 10, ErrDuplicate},
		{Token{0, 4}, 11, ErrStale},
		{Token{0, 4}, 10, ErrStale}, // stale wins over duplicate: a zombie must stop, not skip
		{Token{1, 0}, 11, ErrInvalid},
	}
	for _, tt := range tests {
		err := CheckAdvance(tk, s, tt.tok, tt.pos)
		checkErr(t, "CheckAdvance", s.Token, tt.tok, err, tt.want)
	}
	if err := CheckAdvance(tk, State{Position: NoPosition}, Token{0, 1}, 0); err != nil {
		t.Errorf("first write at offset 0 of a new fence: %v", err)
	}
}

func checkErr(t *testing.T, fn string, stored, presented Token, err, want error) {
	t.Helper()
	if want == nil {
		if err != nil {
			t.Errorf("%s(stored %s, presented %s) = %v, want nil", fn, stored, presented, err)
		}
		return
	}
	if !errors.Is(err, want) {
		t.Errorf("%s(stored %s, presented %s) = %v, want %v", fn, stored, presented, err, want)
		return
	}
	for _, other := range []error{ErrStale, ErrDuplicate, ErrInvalid} {
		if other != want && errors.Is(err, other) {
			t.Errorf("%s(stored %s, presented %s) = %v: is also %v", fn, stored, presented, err, other)
		}
	}
	if want == ErrStale {
		var se *StaleError
		if !errors.As(err, &se) || se.Key != tk || se.Stored != stored || se.Presented != presented {
			t.Errorf("%s: stale error %#v does not carry key, stored and presented", fn, err)
		}
	}
}

func TestCheckAdmit(t *testing.T) {
	stored, seq := Token{0, 5}, int64(10)
	tests := []struct {
		found bool
		tok   Token
		seq   int64
		want  Verdict
	}{
		{false, Token{}, 0, Admitted}, // nothing stored: anything is new
		{true, Token{0, 5}, 11, Admitted},
		{true, Token{0, 5}, 10, Duplicate},
		{true, Token{0, 5}, 0, Duplicate},
		{true, Token{0, 6}, 0, Admitted}, // a higher token restarts the sequence
		{true, Token{0, 4}, 99, Stale},
		{true, Token{1, 0}, 0, Admitted},
	}
	for _, tt := range tests {
		if got := CheckAdmit(stored, seq, tt.found, tt.tok, tt.seq); got != tt.want {
			t.Errorf("CheckAdmit(found %v, %s, %d) = %s, want %s", tt.found, tt.tok, tt.seq, got, tt.want)
		}
	}
}

func TestVerdictString(t *testing.T) {
	for v, want := range map[Verdict]string{Admitted: "admitted", Duplicate: "duplicate", Stale: "stale", 0: "Verdict(0)", 9: "Verdict(9)"} {
		if got := v.String(); got != want {
			t.Errorf("Verdict(%d).String() = %q, want %q", int(v), got, want)
		}
	}
}

func TestValidate(t *testing.T) {
	bad := Key{Group: "", Topic: "t"}
	ok := Token{0, 1}
	invalid := map[string]error{
		"ValidateClaim bad key":         ValidateClaim(bad, ok),
		"ValidateClaim negative era":    ValidateClaim(tk, Token{-1, 0}),
		"ValidateClaim negative epoch":  ValidateClaim(tk, Token{0, -1}),
		"ValidateWrite bad key":         ValidateWrite(bad, ok, 0),
		"ValidateWrite bad token":       ValidateWrite(tk, Token{0, -1}, 0),
		"ValidateWrite negative pos":    ValidateWrite(tk, ok, -1),
		"ValidateWrite NoPosition":      ValidateWrite(tk, ok, NoPosition),
		"ValidateAdmit empty scope":     ValidateAdmit("", "id", ok, 0),
		"ValidateAdmit empty id":        ValidateAdmit("s", "", ok, 0),
		"ValidateAdmit NUL":             ValidateAdmit("s", "i\x00", ok, 0),
		"ValidateAdmit long id":         ValidateAdmit("s", strings.Repeat("i", MaxIdentifierLen+1), ok, 0),
		"ValidateAdmit bad token":       ValidateAdmit("s", "id", Token{-1, 0}, 0),
		"ValidateAdmit negative seq":    ValidateAdmit("s", "id", ok, -1),
		"ValidateRecover bad key":       ValidateRecover(bad, ok, 1, "r"),
		"ValidateRecover bad expected":  ValidateRecover(tk, Token{0, -1}, 1, "r"),
		"ValidateRecover negative":      ValidateRecover(tk, ok, -1, "r"),
		"ValidateRecover without cause": ValidateRecover(tk, ok, 1, ""),
		"ValidateIdentifier empty":      ValidateIdentifier("x", ""),
	}
	for name, err := range invalid {
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s = %v, want ErrInvalid", name, err)
		}
	}
	valid := map[string]error{
		"ValidateClaim":        ValidateClaim(tk, Token{}),
		"ValidateWrite":        ValidateWrite(tk, ok, 0),
		"ValidateAdmit":        ValidateAdmit("s", "id", Token{}, 0),
		"ValidateRecover":      ValidateRecover(tk, Token{}, 0, "group recreated"),
		"ValidateIdentifier":   ValidateIdentifier("x", strings.Repeat("x", MaxIdentifierLen)),
		"ValidateIdentifier ü": ValidateIdentifier("x", "ü"),
	}
	for name, err := range valid {
		if err != nil {
			t.Errorf("%s = %v, want nil", name, err)
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
