package fencestore

import (
	"errors"
	"strings"
	"testing"

	"github.com/batonhq/baton/fence"
)

var tk = fence.Key{Group: "g", Topic: "t", Partition: 2}

func tok(era, epoch int64) fence.Token { return fence.Token{Era: era, Epoch: epoch} }

func TestCheckClaim(t *testing.T) {
	tests := []struct {
		stored, presented fence.Token
		want              error // nil, fence.ErrStale or fence.ErrInvalid
	}{
		{fence.Token{}, fence.Token{}, nil},
		{fence.Token{}, tok(0, 5), nil},
		{tok(0, 5), tok(0, 5), nil}, // equal: the same owner claims again
		{tok(0, 5), tok(0, 6), nil},
		{tok(0, 5), tok(0, 4), fence.ErrStale},
		{tok(0, 5), fence.Token{}, fence.ErrStale},
		{tok(1, 2), tok(0, 99), fence.ErrStale}, // an old era, however high its epoch
		{tok(1, 2), tok(1, 3), nil},
		{tok(0, 5), tok(1, 0), fence.ErrInvalid}, // a later era comes only from Recover
		{tok(1, 5), tok(3, 5), fence.ErrInvalid},
	}
	for _, tt := range tests {
		s := fence.State{Token: tt.stored, Position: 7}
		err := CheckClaim(tk, s, tt.presented)
		checkErr(t, "CheckClaim", tt.stored, tt.presented, err, tt.want)
	}
}

func TestCheckAdvance(t *testing.T) {
	s := fence.State{Token: tok(0, 5), Position: 10}
	tests := []struct {
		tok  fence.Token
		pos  int64
		want error
	}{
		{tok(0, 5), 11, nil},
		{tok(0, 5), 1 << 50, nil}, // gaps are fine
		{tok(0, 6), 11, nil},
		{tok(0, 5), 10, fence.ErrDuplicate},
		{tok(0, 5), 0, fence.ErrDuplicate},
		{tok(0, 6), 10, fence.ErrDuplicate},
		{tok(0, 4), 11, fence.ErrStale},
		{tok(0, 4), 10, fence.ErrStale}, // stale wins over duplicate: a zombie must stop, not skip
		{tok(1, 0), 11, fence.ErrInvalid},
	}
	for _, tt := range tests {
		err := CheckAdvance(tk, s, tt.tok, tt.pos)
		checkErr(t, "CheckAdvance", s.Token, tt.tok, err, tt.want)
	}
	if err := CheckAdvance(tk, fence.State{Position: fence.NoPosition}, tok(0, 1), 0); err != nil {
		t.Errorf("first write at offset 0 of a new fence: %v", err)
	}
}

func checkErr(t *testing.T, fn string, stored, presented fence.Token, err, want error) {
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
	for _, other := range []error{fence.ErrStale, fence.ErrDuplicate, fence.ErrInvalid} {
		if other != want && errors.Is(err, other) {
			t.Errorf("%s(stored %s, presented %s) = %v: is also %v", fn, stored, presented, err, other)
		}
	}
	if want == fence.ErrStale {
		var se *fence.StaleError
		if !errors.As(err, &se) || se.Key != tk || se.Stored != stored || se.Presented != presented {
			t.Errorf("%s: stale error %#v does not carry key, stored and presented", fn, err)
		}
	}
}

func TestCheckAdmit(t *testing.T) {
	stored, seq := tok(0, 5), int64(10)
	tests := []struct {
		found bool
		tok   fence.Token
		seq   int64
		want  fence.Verdict
	}{
		{false, fence.Token{}, 0, fence.Admitted}, // nothing stored: anything is new
		{true, tok(0, 5), 11, fence.Admitted},
		{true, tok(0, 5), 10, fence.Duplicate},
		{true, tok(0, 5), 0, fence.Duplicate},
		{true, tok(0, 6), 0, fence.Admitted}, // a higher token restarts the sequence
		{true, tok(0, 4), 99, fence.Stale},
		{true, tok(1, 0), 0, fence.Admitted},
	}
	for _, tt := range tests {
		if got := CheckAdmit(stored, seq, tt.found, tt.tok, tt.seq); got != tt.want {
			t.Errorf("CheckAdmit(found %v, %s, %d) = %s, want %s", tt.found, tt.tok, tt.seq, got, tt.want)
		}
	}
}

func TestValidate(t *testing.T) {
	bad := fence.Key{Group: "", Topic: "t"}
	ok := tok(0, 1)
	invalid := map[string]error{
		"ValidateClaim bad key":          ValidateClaim(bad, ok),
		"ValidateClaim negative era":     ValidateClaim(tk, tok(-1, 0)),
		"ValidateClaim negative epoch":   ValidateClaim(tk, tok(0, -1)),
		"ValidateWrite bad key":          ValidateWrite(bad, ok, 0),
		"ValidateWrite bad token":        ValidateWrite(tk, tok(0, -1), 0),
		"ValidateWrite negative pos":     ValidateWrite(tk, ok, -1),
		"ValidateWrite fence.NoPosition": ValidateWrite(tk, ok, fence.NoPosition),
		"ValidateAdmit empty scope":      ValidateAdmit("", "id", ok, 0),
		"ValidateAdmit empty id":         ValidateAdmit("s", "", ok, 0),
		"ValidateAdmit NUL":              ValidateAdmit("s", "i\x00", ok, 0),
		"ValidateAdmit long id":          ValidateAdmit("s", strings.Repeat("i", fence.MaxIdentifierLen+1), ok, 0),
		"ValidateAdmit bad token":        ValidateAdmit("s", "id", tok(-1, 0), 0),
		"ValidateAdmit negative seq":     ValidateAdmit("s", "id", ok, -1),
		"ValidateRecover bad key":        ValidateRecover(bad, ok, 1, "r"),
		"ValidateRecover bad expected":   ValidateRecover(tk, tok(0, -1), 1, "r"),
		"ValidateRecover negative":       ValidateRecover(tk, ok, -1, "r"),
		"ValidateRecover without cause":  ValidateRecover(tk, ok, 1, ""),
		"ValidateIdentifier empty":       ValidateIdentifier("x", ""),
	}
	for name, err := range invalid {
		if !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s = %v, want fence.ErrInvalid", name, err)
		}
	}
	valid := map[string]error{
		"ValidateClaim":        ValidateClaim(tk, fence.Token{}),
		"ValidateWrite":        ValidateWrite(tk, ok, 0),
		"ValidateAdmit":        ValidateAdmit("s", "id", fence.Token{}, 0),
		"ValidateRecover":      ValidateRecover(tk, fence.Token{}, 0, "group recreated"),
		"ValidateIdentifier":   ValidateIdentifier("x", strings.Repeat("x", fence.MaxIdentifierLen)),
		"ValidateIdentifier ü": ValidateIdentifier("x", "ü"),
	}
	for name, err := range valid {
		if err != nil {
			t.Errorf("%s = %v, want nil", name, err)
		}
	}
}

// FuzzValidateIdentifier: the store rule and fence.Key.Validate accept the same names.
func FuzzValidateIdentifier(f *testing.F) {
	for _, s := range []string{"", "g", "a\x00b", "\xc3", "ü", strings.Repeat("x", fence.MaxIdentifierLen), strings.Repeat("x", fence.MaxIdentifierLen+1)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		store := ValidateIdentifier("group", s)
		key := fence.Key{Group: s, Topic: "t"}.Validate()
		if (store == nil) != (key == nil) {
			t.Fatalf("ValidateIdentifier(%q) = %v, Key.Validate = %v", s, store, key)
		}
		if store != nil && !errors.Is(store, fence.ErrInvalid) {
			t.Fatalf("ValidateIdentifier(%q) = %v, want fence.ErrInvalid", s, store)
		}
	})
}
