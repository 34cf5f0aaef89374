package fence

import (
	"bytes"
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
		if got := tt.a.Less(tt.b); got != (tt.want < 0) {
			t.Errorf("%s.Less(%s) = %v", tt.a, tt.b, got)
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

func TestTokenBinary(t *testing.T) {
	tests := []struct {
		tok  Token
		want []byte
	}{
		{Token{}, make([]byte, 16)},
		{Token{1, 2}, []byte{0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2}},
		{Token{0x0102030405060708, 0x1112131415161718}, []byte{1, 2, 3, 4, 5, 6, 7, 8, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18}},
	}
	for _, tt := range tests {
		b, err := tt.tok.MarshalBinary()
		if err != nil || !bytes.Equal(b, tt.want) {
			t.Errorf("MarshalBinary(%s) = %x, %v; want %x", tt.tok, b, err, tt.want)
		}
		var got Token
		if err := got.UnmarshalBinary(tt.want); err != nil || got != tt.tok {
			t.Errorf("UnmarshalBinary(%x) = %s, %v; want %s", tt.want, got, err, tt.tok)
		}
		prefixed, err := tt.tok.AppendBinary([]byte("pre"))
		if err != nil || !bytes.Equal(prefixed, append([]byte("pre"), tt.want...)) {
			t.Errorf("AppendBinary = %x, %v", prefixed, err)
		}
	}
	for _, tok := range []Token{{-1, 0}, {0, -1}, {math.MinInt64, 0}} {
		if _, err := tok.MarshalBinary(); !errors.Is(err, ErrInvalid) {
			t.Errorf("MarshalBinary(%d.%d): %v, want ErrInvalid", tok.Era, tok.Epoch, err)
		}
	}
	negEra := append([]byte{0x80}, make([]byte, 15)...)
	negEpoch := append(make([]byte, 8), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
	for _, b := range [][]byte{nil, {}, make([]byte, 15), make([]byte, 17), negEra, negEpoch} {
		tok := Token{7, 7}
		if err := tok.UnmarshalBinary(b); !errors.Is(err, ErrInvalid) || tok != (Token{7, 7}) {
			t.Errorf("UnmarshalBinary(%x) = %v, %v; want ErrInvalid and no change", b, tok, err)
		}
	}
}

// TestTokenBinaryOrder: the encodings of valid tokens sort bytewise in token order, so a store
// can compare them as bytes.
func TestTokenBinaryOrder(t *testing.T) {
	toks := []Token{{}, {0, 1}, {0, 255}, {0, 256}, {0, math.MaxInt64}, {1, 0}, {1, 1}, {255, 3}, {256, 0}, {math.MaxInt64, math.MaxInt64}}
	for _, a := range toks {
		for _, b := range toks {
			ea, _ := a.MarshalBinary()
			eb, _ := b.MarshalBinary()
			if got, want := bytes.Compare(ea, eb), a.Compare(b); got != want {
				t.Errorf("bytes order of %s vs %s = %d, token order %d", a, b, got, want)
			}
		}
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
		if err := tok.Validate(); err != nil {
			t.Fatalf("ParseToken(%q) accepted an invalid token: %v", s, err)
		}
		b, err := tok.MarshalText()
		if err != nil || string(b) != s {
			t.Fatalf("MarshalText = %q, %v", b, err)
		}
	})
}

func FuzzUnmarshalBinary(f *testing.F) {
	f.Add(make([]byte, 16))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2})
	f.Add(append([]byte{0x80}, make([]byte, 15)...))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		var tok Token
		if err := tok.UnmarshalBinary(b); err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("UnmarshalBinary(%x): error %v does not wrap ErrInvalid", b, err)
			}
			if tok != (Token{}) {
				t.Fatalf("failed UnmarshalBinary(%x) changed the token to %s", b, tok)
			}
			return
		}
		enc, err := tok.MarshalBinary()
		if err != nil || !bytes.Equal(enc, b) {
			t.Fatalf("UnmarshalBinary(%x) = %s, which encodes as %x, %v", b, tok, enc, err)
		}
		back, err := ParseToken(tok.String())
		if err != nil || back != tok {
			t.Fatalf("text round trip of %s = %s, %v", tok, back, err)
		}
	})
}
