package fencecheck

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/batonhq/baton/fence"
)

var tk = fence.Key{Group: "g", Topic: "t", Partition: 2}

func tok(era, epoch int64) fence.Token { return fence.Token{Era: era, Epoch: epoch} }

func TestCheckClaim(t *testing.T) {
	tests := []struct {
		stored, presented fence.Token
		holder, claimant  string
		want              error // nil, fence.ErrStale or fence.ErrInvalid
	}{
		{fence.Token{}, fence.Token{}, "", "c", nil}, // the zero token of a fence never claimed: nobody holds it
		{fence.Token{}, fence.Token{}, "a", "c", fence.ErrStale},
		{fence.Token{}, tok(0, 5), "", "c", nil},
		{tok(0, 5), tok(0, 5), "c", "c", nil},            // the same claimant re-claims (a lost reply)
		{tok(0, 5), tok(0, 5), "a", "c", fence.ErrStale}, // equal token, another claimant: refused
		{tok(0, 5), tok(0, 5), "", "c", fence.ErrStale},  // a legacy row: nobody can prove it held it
		{tok(0, 5), tok(0, 6), "a", "c", nil},
		{tok(0, 5), tok(0, 4), "c", "c", fence.ErrStale},
		{tok(0, 5), fence.Token{}, "c", "c", fence.ErrStale},
		{tok(1, 2), tok(0, 99), "c", "c", fence.ErrStale}, // an old era, however high its epoch
		{tok(1, 2), tok(1, 3), "a", "c", nil},
		{tok(0, 5), tok(1, 0), "c", "c", fence.ErrInvalid}, // a later era comes only from Recover
		{tok(1, 5), tok(3, 5), "c", "c", fence.ErrInvalid},
	}
	for _, tt := range tests {
		s := fence.State{Token: tt.stored, Position: 7, Claimant: tt.holder}
		err := CheckClaim(tk, s, tt.presented, tt.claimant)
		checkErr(t, "CheckClaim", tt.stored, tt.presented, err, tt.want)
	}
}

func TestCheckAdvance(t *testing.T) {
	s := fence.State{Token: tok(0, 5), Position: 10, Claimant: "c"}
	tests := []struct {
		tok         fence.Token
		first, last int64
		want        error
	}{
		{tok(0, 5), 11, 11, nil},
		{tok(0, 5), 11, 40, nil},
		{tok(0, 5), 1 << 50, 1 << 51, nil}, // gaps are fine: first > stored, not first == stored+1
		{tok(0, 6), 11, 11, fence.ErrNotClaimed},
		{tok(0, 5), 10, 10, fence.ErrDuplicate},
		{tok(0, 5), 0, 10, fence.ErrDuplicate},
		{tok(0, 5), 0, 0, fence.ErrDuplicate},
		{tok(0, 5), 10, 11, fence.ErrOverlap}, // a batch spanning the stored position
		{tok(0, 5), 1, 50, fence.ErrOverlap},
		{tok(0, 6), 1, 50, fence.ErrNotClaimed},
		{tok(0, 4), 11, 11, fence.ErrStale},
		{tok(0, 4), 10, 10, fence.ErrStale}, // stale wins over duplicate: a zombie must stop, not skip
		{tok(0, 4), 5, 20, fence.ErrStale},  // and over overlap
		{tok(1, 0), 11, 11, fence.ErrInvalid},
	}
	for _, tt := range tests {
		err := CheckAdvance(tk, s, tt.tok, tt.first, tt.last)
		checkErr(t, "CheckAdvance", s.Token, tt.tok, err, tt.want)
	}
	if err := CheckAdvance(tk, fence.State{Position: fence.NoPosition}, fence.Token{}, 0, 0); err != nil {
		t.Errorf("first write at offset 0 of a new fence under the zero token: %v", err)
	}
	if err := CheckAdvance(tk, fence.State{Position: fence.NoPosition}, tok(0, 1), 0, 0); !errors.Is(err, fence.ErrNotClaimed) {
		t.Errorf("write under an unclaimed token: %v, want ErrNotClaimed", err)
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
	for _, other := range []error{fence.ErrStale, fence.ErrDuplicate, fence.ErrInvalid, fence.ErrOverlap, fence.ErrNotClaimed} {
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
		"ValidateClaim bad key":          ValidateClaim(bad, ok, "c"),
		"ValidateClaim negative era":     ValidateClaim(tk, tok(-1, 0), "c"),
		"ValidateClaim negative epoch":   ValidateClaim(tk, tok(0, -1), "c"),
		"ValidateClaim no claimant":      ValidateClaim(tk, ok, ""),
		"ValidateClaim NUL claimant":     ValidateClaim(tk, ok, "a\x00"),
		"ValidateWrite bad key":          ValidateWrite(bad, ok, 0, 0),
		"ValidateWrite bad token":        ValidateWrite(tk, tok(0, -1), 0, 0),
		"ValidateWrite negative pos":     ValidateWrite(tk, ok, -1, 0),
		"ValidateWrite fence.NoPosition": ValidateWrite(tk, ok, fence.NoPosition, fence.NoPosition),
		"ValidateWrite first > last":     ValidateWrite(tk, ok, 5, 4),
		"ValidateAdmit empty scope":      ValidateAdmit("", "id", ok, 0),
		"ValidateAdmit empty id":         ValidateAdmit("s", "", ok, 0),
		"ValidateAdmit NUL":              ValidateAdmit("s", "i\x00", ok, 0),
		"ValidateAdmit long id":          ValidateAdmit("s", strings.Repeat("i", MaxIdentifierLen+1), ok, 0),
		"ValidateAdmit bad token":        ValidateAdmit("s", "id", tok(-1, 0), 0),
		"ValidateAdmit negative seq":     ValidateAdmit("s", "id", ok, -1),
		"ValidateRecover bad key":        ValidateRecover(bad, ok, 1, "c", "r"),
		"ValidateRecover bad expected":   ValidateRecover(tk, tok(0, -1), 1, "c", "r"),
		"ValidateRecover negative":       ValidateRecover(tk, ok, -1, "c", "r"),
		"ValidateRecover without cause":  ValidateRecover(tk, ok, 1, "c", ""),
		"ValidateRecover no claimant":    ValidateRecover(tk, ok, 1, "", "r"),
		"ValidateIdentifier empty":       ValidateIdentifier("x", ""),
	}
	for name, err := range invalid {
		if !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s = %v, want fence.ErrInvalid", name, err)
		}
	}
	valid := map[string]error{
		"ValidateClaim":        ValidateClaim(tk, fence.Token{}, "c"),
		"ValidateWrite":        ValidateWrite(tk, ok, 0, 0),
		"ValidateWrite batch":  ValidateWrite(tk, ok, 3, 9),
		"ValidateAdmit":        ValidateAdmit("s", "id", fence.Token{}, 0),
		"ValidateRecover":      ValidateRecover(tk, fence.Token{}, 0, "c", "group recreated"),
		"ValidateIdentifier":   ValidateIdentifier("x", strings.Repeat("x", MaxIdentifierLen)),
		"ValidateIdentifier ü": ValidateIdentifier("x", "ü"),
	}
	for name, err := range valid {
		if err != nil {
			t.Errorf("%s = %v, want nil", name, err)
		}
	}
}

// FuzzValidateIdentifier: a name is accepted exactly when it is non-empty, at most
// MaxIdentifierLen bytes of UTF-8 without NUL; a refusal wraps fence.ErrInvalid, and ValidateKey
// applies the same rule to a key's group.
func FuzzValidateIdentifier(f *testing.F) {
	for _, s := range []string{"", "g", "a\x00b", "\xc3", "ü", strings.Repeat("x", MaxIdentifierLen), strings.Repeat("x", MaxIdentifierLen+1)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := ValidateIdentifier("group", s)
		valid := s != "" && len(s) <= MaxIdentifierLen && utf8.ValidString(s) && !strings.Contains(s, "\x00")
		if (err == nil) != valid {
			t.Fatalf("ValidateIdentifier(%q) = %v, want valid=%v", s, err, valid)
		}
		if err != nil && !errors.Is(err, fence.ErrInvalid) {
			t.Fatalf("ValidateIdentifier(%q) = %v, want fence.ErrInvalid", s, err)
		}
		if key := ValidateKey(fence.Key{Group: s, Topic: "t"}); (key == nil) != valid {
			t.Fatalf("ValidateKey(group %q) = %v, want valid=%v", s, key, valid)
		}
	})
}

func TestValidateKey(t *testing.T) {
	long := strings.Repeat("x", MaxIdentifierLen)
	for _, k := range []fence.Key{tk, {Group: long, Topic: long, Partition: 0}, {Group: "gruppe-ü", Topic: "a b/c", Partition: 1<<31 - 1}} {
		if err := ValidateKey(k); err != nil {
			t.Errorf("ValidateKey(%q): %v", k, err)
		}
	}
	for name, k := range map[string]fence.Key{
		"empty group":        {Group: "", Topic: "t"},
		"empty topic":        {Group: "g", Topic: ""},
		"negative partition": {Group: "g", Topic: "t", Partition: -1},
		"long group":         {Group: long + "x", Topic: "t"},
		"long topic":         {Group: "g", Topic: long + "x"},
		"NUL":                {Group: "g\x00", Topic: "t"},
		"NUL in the middle":  {Group: "g", Topic: "a\x00b"},
		"bad UTF-8":          {Group: "g", Topic: "\xc3"},
	} {
		if err := ValidateKey(k); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s: ValidateKey = %v, want ErrInvalid", name, err)
		}
	}
}

func TestValidateToken(t *testing.T) {
	for _, tok := range []fence.Token{{}, {Epoch: 1}, {Era: 3}} {
		if err := ValidateToken(tok); err != nil {
			t.Errorf("ValidateToken(%s): %v", tok, err)
		}
	}
	for _, tok := range []fence.Token{{Era: -1}, {Epoch: -1}} {
		if err := ValidateToken(tok); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("ValidateToken(%d.%d) = %v, want ErrInvalid", tok.Era, tok.Epoch, err)
		}
	}
}
