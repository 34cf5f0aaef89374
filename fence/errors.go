package fence

import (
	"errors"
	"fmt"
)

var (
	// ErrStale means a write or claim presented a token lower than the one stored with the
	// fence: the writer is no longer the owner. It is never transient; retrying cannot help.
	// Errors returned for it are *StaleError.
	ErrStale = errors.New("fence: stale token")

	// ErrDuplicate means the fence already holds this token and a position at or beyond the
	// one presented: the batch was applied before (a replay, or a retried commit that had in
	// fact succeeded). The caller's writes were rolled back; skipping the batch is correct.
	ErrDuplicate = errors.New("fence: position already applied")

	// ErrNotClaimed means a write presented a token higher than the stored one: writes
	// happen only under the token a Claim (or Recover) stored, so the writer must claim
	// first. Nothing was written.
	ErrNotClaimed = errors.New("fence: token not claimed")

	// ErrOverlap means a batch spans the stored position: part of it (up to the stored
	// position) was applied before. Nothing was written; the caller reloads the state and
	// applies only the records after the stored position.
	ErrOverlap = errors.New("fence: batch overlaps the applied position")

	// ErrConflict means a [Sink.Recover] compare-and-set lost: the stored token was not the
	// expected one.
	ErrConflict = errors.New("fence: recover conflict")

	// ErrInvalid means bad input: a negative token or position, an empty identifier, an
	// invalid table name, a missing reason.
	ErrInvalid = errors.New("fence: invalid argument")
)

// StaleError is returned (wrapped or not) when a presented token is lower than the stored one,
// or equal to it while another claimant holds it (then Stored == Presented).
type StaleError struct {
	Key       Key
	Stored    Token // the highest token the sink has accepted
	Presented Token // the token that was refused
}

func (e *StaleError) Error() string {
	if e.Stored == e.Presented {
		return fmt.Sprintf("fence: stale token for %s: token %s is held by another claimant", e.Key, e.Presented)
	}
	return fmt.Sprintf("fence: stale token for %s: presented %s, stored %s", e.Key, e.Presented, e.Stored)
}

// Unwrap returns [ErrStale].
func (e *StaleError) Unwrap() error { return ErrStale }

// RegressionError reports an epoch regression for a key: the epoch source went backwards (the
// consumer group was deleted or expired and recreated), so the current owner (verified with the
// group coordinator) holds Presented, yet the sink stores the higher Stored. Find it with
// errors.As. Recovery goes only through [Sink.Recover].
type RegressionError struct {
	Key       Key
	Stored    Token
	Presented Token
}

func (e *RegressionError) Error() string {
	return fmt.Sprintf("fence: epoch regression for %s: current owner presents %s, sink stores %s", e.Key, e.Presented, e.Stored)
}
