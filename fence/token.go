package fence

import (
	"fmt"
	"strconv"
	"strings"
)

// Token is the fencing token a partition's owner carries with every write.
//
// Epoch is the consumer-group generation at which the owner was assigned the partition (or, for
// other epoch sources, any number that strictly increases across successive owners). Era is the
// regression guard: it is stored with the fence and raised only by an explicit, recorded
// [Sink.Recover] when the epoch source has gone backwards (a group deleted or expired and
// recreated, a group id changed, a counter wrapped). Tokens order lexicographically by
// (Era, Epoch), so every token of a later era outranks every token of an earlier one.
//
// The zero Token is "no owner yet" and is lower than every token a real owner presents. Neither
// field may be negative: a sink refuses such a token with [ErrInvalid].
type Token struct {
	Era   int64
	Epoch int64
}

// Compare returns -1, 0 or +1 as t is lower than, equal to or higher than u.
func (t Token) Compare(u Token) int {
	switch {
	case t.Era < u.Era:
		return -1
	case t.Era > u.Era:
		return 1
	case t.Epoch < u.Epoch:
		return -1
	case t.Epoch > u.Epoch:
		return 1
	}
	return 0
}

// IsZero reports whether t is the zero token.
func (t Token) IsZero() bool { return t == Token{} }

// validate returns an error wrapping [ErrInvalid] if either field is negative: a sink refuses
// such a token.
func (t Token) validate() error {
	if t.Era < 0 || t.Epoch < 0 {
		return fmt.Errorf("%w: token %d.%d has a negative field", ErrInvalid, t.Era, t.Epoch)
	}
	return nil
}

// String formats t as "era.epoch", e.g. "0.17". It is the text form of MarshalText.
func (t Token) String() string {
	return strconv.FormatInt(t.Era, 10) + "." + strconv.FormatInt(t.Epoch, 10)
}

// ParseToken parses the "era.epoch" form written by [Token.String]. It accepts only two
// non-negative decimal integers without signs, spaces or leading zeros, so that every token has
// exactly one text form.
func ParseToken(s string) (Token, error) {
	era, epoch, ok := strings.Cut(s, ".")
	if !ok {
		return Token{}, fmt.Errorf("%w: token %q is not era.epoch", ErrInvalid, s)
	}
	e, err := parseCanonical(era)
	if err != nil {
		return Token{}, fmt.Errorf("%w: token %q: era: %v", ErrInvalid, s, err)
	}
	g, err := parseCanonical(epoch)
	if err != nil {
		return Token{}, fmt.Errorf("%w: token %q: epoch: %v", ErrInvalid, s, err)
	}
	return Token{Era: e, Epoch: g}, nil
}

func parseCanonical(s string) (int64, error) {
	if s == "" {
		return 0, fmt.Errorf("empty")
	}
	if len(s) > 1 && s[0] == '0' {
		return 0, fmt.Errorf("leading zero")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("not a decimal digit at %d", i)
		}
	}
	return strconv.ParseInt(s, 10, 64)
}

// MarshalText implements encoding.TextMarshaler with the [Token.String] form.
func (t Token) MarshalText() ([]byte, error) {
	if err := t.validate(); err != nil {
		return nil, err
	}
	return []byte(t.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler with [ParseToken].
func (t *Token) UnmarshalText(b []byte) error {
	v, err := ParseToken(string(b))
	if err != nil {
		return err
	}
	*t = v
	return nil
}
