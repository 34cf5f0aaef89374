package fencestore

import (
	"fmt"
	"unicode/utf8"

	"github.com/batonhq/baton/fence"
)

// ValidateIdentifier checks a name used as (part of) a fence key, or as a keyed fence's scope
// or id: non-empty, at most [fence.MaxIdentifierLen] bytes, valid UTF-8 without NUL bytes
// (PostgreSQL text cannot hold them). It is the rule fence.Key.Validate applies to the group
// and topic.
func ValidateIdentifier(what, s string) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: empty %s", fence.ErrInvalid, what)
	case len(s) > fence.MaxIdentifierLen:
		return fmt.Errorf("%w: %s is %d bytes, more than %d", fence.ErrInvalid, what, len(s), fence.MaxIdentifierLen)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: %s is not valid UTF-8", fence.ErrInvalid, what)
	}
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return fmt.Errorf("%w: %s contains a NUL byte", fence.ErrInvalid, what)
		}
	}
	return nil
}

// CheckAdvance is the fence rule every store applies, written once: it returns nil if a write
// under t up to position may advance a fence in state s, a *fence.StaleError if t is lower
// than the stored token, and fence.ErrDuplicate if position is not beyond the stored position.
func CheckAdvance(k fence.Key, s fence.State, t fence.Token, position int64) error {
	if err := CheckClaim(k, s, t); err != nil {
		return err
	}
	if position <= s.Position {
		return fmt.Errorf("%w: %s at %d, stored position %d", fence.ErrDuplicate, k, position, s.Position)
	}
	return nil
}

// CheckClaim is the claim rule every store applies, written once: t may take the fence in
// state s if it is not lower than the stored token and does not invent a later era (eras
// advance only through Recover).
func CheckClaim(k fence.Key, s fence.State, t fence.Token) error {
	if t.Less(s.Token) {
		return &fence.StaleError{Key: k, Stored: s.Token, Presented: t}
	}
	if t.Era > s.Token.Era {
		return fmt.Errorf("%w: %s: token %s is of a later era than the stored %s; eras advance only through Recover", fence.ErrInvalid, k, t, s.Token)
	}
	return nil
}

// CheckAdmit is the keyed-fence rule every store applies, written once.
func CheckAdmit(storedToken fence.Token, storedSeq int64, found bool, t fence.Token, seq int64) fence.Verdict {
	if !found {
		return fence.Admitted
	}
	switch c := t.Compare(storedToken); {
	case c < 0:
		return fence.Stale
	case c == 0 && seq <= storedSeq:
		return fence.Duplicate
	}
	return fence.Admitted
}

// ValidateClaim checks the arguments of Claim.
func ValidateClaim(k fence.Key, t fence.Token) error {
	if err := k.Validate(); err != nil {
		return err
	}
	return t.Validate()
}

// ValidateWrite checks the arguments of Apply and Advance.
func ValidateWrite(k fence.Key, t fence.Token, position int64) error {
	if err := k.Validate(); err != nil {
		return err
	}
	if err := t.Validate(); err != nil {
		return err
	}
	if position < 0 {
		return fmt.Errorf("%w: position %d is negative", fence.ErrInvalid, position)
	}
	return nil
}

// ValidateAdmit checks the arguments of KeyedSink.Admit.
func ValidateAdmit(scope, id string, t fence.Token, seq int64) error {
	if err := ValidateIdentifier("scope", scope); err != nil {
		return err
	}
	if err := ValidateIdentifier("id", id); err != nil {
		return err
	}
	if err := t.Validate(); err != nil {
		return err
	}
	if seq < 0 {
		return fmt.Errorf("%w: sequence %d is negative", fence.ErrInvalid, seq)
	}
	return nil
}

// ValidateRecover checks the arguments of Sink.Recover.
func ValidateRecover(k fence.Key, expected fence.Token, epoch int64, reason string) error {
	if err := k.Validate(); err != nil {
		return err
	}
	if err := expected.Validate(); err != nil {
		return err
	}
	if epoch < 0 {
		return fmt.Errorf("%w: epoch %d is negative", fence.ErrInvalid, epoch)
	}
	if reason == "" {
		return fmt.Errorf("%w: a recovery needs a reason", fence.ErrInvalid)
	}
	return nil
}
