package sqlident

import (
	"errors"
	"fmt"
	"strings"
)

// MaxLen is the longest identifier part accepted, in bytes.
const MaxLen = 63

// ErrInvalid means a name is not an acceptable identifier. Callers wrap it in their own
// package's sentinel.
var ErrInvalid = errors.New("sqlident: invalid identifier")

// Validate returns nil if name is "table" or "schema.table" with each part of the accepted
// form, and an error wrapping [ErrInvalid] otherwise.
func Validate(name string) error {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return fmt.Errorf("%w: %q has more than two dot-separated parts", ErrInvalid, name)
	}
	for _, p := range parts {
		if err := validatePart(p); err != nil {
			return fmt.Errorf("%w: %q: %s", ErrInvalid, name, err)
		}
	}
	return nil
}

func validatePart(p string) error {
	if p == "" {
		return errors.New("empty part")
	}
	if len(p) > MaxLen {
		return fmt.Errorf("part is %d bytes, more than %d", len(p), MaxLen)
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return fmt.Errorf("byte %d (%q) is not allowed; use [A-Za-z_][A-Za-z0-9_]*", i, c)
		}
	}
	return nil
}

// Quote returns name with each dot-separated part in double quotes, ready to splice into SQL
// for PostgreSQL or SQLite. Callers validate first; Quote still doubles any embedded quote so
// that even an unvalidated name cannot end the quoted identifier early.
func Quote(name string) string {
	parts := strings.Split(name, ".")
	for i, p := range parts {
		parts[i] = `"` + strings.ReplaceAll(p, `"`, `""`) + `"`
	}
	return strings.Join(parts, ".")
}
