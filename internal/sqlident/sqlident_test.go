package sqlident

import (
	"errors"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	ok := []string{
		"t", "_", "baton_fences", "Fences2", "s.t", "public.baton_fences", "select",
		strings.Repeat("a", MaxLen), strings.Repeat("a", MaxLen) + "." + strings.Repeat("b", MaxLen),
	}
	for _, name := range ok {
		if err := Validate(name); err != nil {
			t.Errorf("Validate(%q) = %v, want nil", name, err)
		}
	}
	bad := []string{
		"", ".", "s.", ".t", "a.b.c", "1t", "t-1", "t 1", "t;", `t"`, `"t"`, "t;DROP TABLE x",
		`x"; DROP TABLE y; --`, "t\x00", "tä", "s.1t", strings.Repeat("a", MaxLen+1),
		"s." + strings.Repeat("a", MaxLen+1), "t\n",
	}
	for _, name := range bad {
		err := Validate(name)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("Validate(%q) = %v, want ErrInvalid", name, err)
		}
	}
}

func TestQuote(t *testing.T) {
	for in, want := range map[string]string{
		"t":        `"t"`,
		"Fences":   `"Fences"`,
		"s.t":      `"s"."t"`,
		`a"b`:      `"a""b"`,
		`x"; --`:   `"x""; --"`,
		"select.x": `"select"."x"`,
	} {
		if got := Quote(in); got != want {
			t.Errorf("Quote(%q) = %s, want %s", in, got, want)
		}
	}
}
