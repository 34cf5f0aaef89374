package fence

import (
	"encoding/json"
	"errors"
	"math"
	"testing"
)

func TestTokenCompare(t *testing.T) {
	tests := []struct {
		a, b Token
		want int
	}{
		{Token{}, Token{}, 0},
		{Token{0, 1}, Token{0, 1}, 0},
		{Token{0, 1}, Token{0, 2}, -1},
		{Token{0, 2}, Token{0, 1}, 1},
		{Token{1, 0}, Token{0, 99}, 1}, // a later era outranks every epoch of an earlier one
		{Token{0, math.MaxInt64}, Token{1, 0}, -1},
		{Token{2, 5}, Token{2, 5}, 0},
		{Token{2, 4}, Token{2, 5}, -1},
		{Token{}, Token{0, 1}, -1}, // the zero token is below every owner's
	}
	for _, tt := range tests {
		if got := tt.a.Compare(tt.b); got != tt.want {
			t.Errorf("%s.Compare(%s) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
		if got := tt.b.Compare(tt.a); got != -tt.want {
			t.Errorf("%s.Compare(%s) = %d, want %d", tt.b, tt.a, got, -tt.want)
		}
	}
	if !(Token{}).IsZero() || (Token{0, 1}).IsZero() || (Token{1, 0}).IsZero() {
		t.Error("IsZero is wrong")
	}
}

func TestTokenString(t *testing.T) {
	tests := []struct {
		tok  Token
		want string
	}{
		{Token{}, "0.0"},
		{Token{0, 17}, "0.17"},
		{Token{3, 0}, "3.0"},
		{Token{math.MaxInt64, math.MaxInt64}, "9223372036854775807.9223372036854775807"},
	}
	for _, tt := range tests {
		if got := tt.tok.String(); got != tt.want {
			t.Errorf("String() = %q, want %q", got, tt.want)
		}
		got, err := ParseToken(tt.want)
		if err != nil || got != tt.tok {
			t.Errorf("ParseToken(%q) = %v, %v; want %v", tt.want, got, err, tt.tok)
		}
	}
}

func TestParseTokenRejects(t *testing.T) {
	for _, s := range []string{
		"", ".", "1", "1.", ".1", "1.2.3", "01.2", "1.02", "00.0", "+1.2", "1.+2", "-1.2", "1.-2",
		" 1.2", "1.2 ", "1 .2", "1,2", "a.b", "0x1.2", "1e3.0", "１.2",
		"9223372036854775808.0", "0.9223372036854775808", "99999999999999999999.0",
	} {
		if tok, err := ParseToken(s); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseToken(%q) = %v, %v; want ErrInvalid", s, tok, err)
		}
	}
}

func TestTokenText(t *testing.T) {
	b, err := json.Marshal(map[string]Token{"t": {2, 40}})
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"t":"2.40"}` {
		t.Fatalf("JSON = %s", b)
	}
	var m map[string]Token
	if err := json.Unmarshal(b, &m); err != nil || m["t"] != (Token{2, 40}) {
		t.Fatalf("JSON round trip = %v, %v", m, err)
	}
	if err := json.Unmarshal([]byte(`{"t":"2.040"}`), &m); !errors.Is(err, ErrInvalid) {
		t.Fatalf("non-canonical JSON token: %v, want ErrInvalid", err)
	}
	if _, err := (Token{-1, 0}).MarshalText(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("MarshalText of a negative token: %v, want ErrInvalid", err)
	}
	tok := Token{5, 5}
	if err := tok.UnmarshalText([]byte("x")); err == nil || tok != (Token{5, 5}) {
		t.Fatalf("failed UnmarshalText changed the token to %v (err %v)", tok, err)
	}
}

func FuzzParseToken(f *testing.F) {
	for _, s := range []string{"0.0", "1.2", "01.2", "1.2.3", "-1.2", "9223372036854775807.9223372036854775807", "9223372036854775808.0", "", "."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := ParseToken(s)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("ParseToken(%q): error %v does not wrap ErrInvalid", s, err)
			}
			return
		}
		// Exactly one text form per token: anything accepted re-encodes to the input.
		if tok.String() != s {
			t.Fatalf("ParseToken(%q) = %s, which formats differently", s, tok)
		}
		if err := tok.validate(); err != nil {
			t.Fatalf("ParseToken(%q) accepted an invalid token: %v", s, err)
		}
		b, err := tok.MarshalText()
		if err != nil || string(b) != s {
			t.Fatalf("MarshalText = %q, %v", b, err)
		}
	})
}
