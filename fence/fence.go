package fence

import (
	"context"
	"strconv"
	"time"
)

// NoPosition is the position of a fence that has applied nothing yet. Kafka offsets start at 0.
const NoPosition int64 = -1

// Key names one fence: a partition of a topic as consumed by one consumer group. A sink refuses,
// with [ErrInvalid], a key whose Group or Topic is empty, longer than 1024 bytes, not UTF-8 or
// holds a NUL byte (PostgreSQL text cannot), or whose Partition is negative; claimants and
// keyed-fence scopes and ids obey the same rule.
type Key struct {
	Group     string
	Topic     string
	Partition int32
}

// String formats k as "group/topic/partition".
func (k Key) String() string {
	return k.Group + "/" + k.Topic + "/" + strconv.FormatInt(int64(k.Partition), 10)
}

// State is what a sink stores for one fence.
type State struct {
	Token    Token  // the highest token accepted
	Position int64  // the last applied position (offset), NoPosition if none
	Claimant string // who holds Token: the claimant of the last Claim or Recover; "" for nobody
}

// Recovery records one explicit era advance made by [Sink.Recover].
type Recovery struct {
	Key    Key
	From   Token // the stored token the recovery replaced
	To     Token // the new token: era From.Era+1, the verified owner's epoch
	Reason string
	At     time.Time // the sink's clock; informational only, never used for safety
}

// Sink is a fenced sink: a store that keeps, per [Key], the highest accepted token and the last
// applied position next to the data, and refuses atomically any write under a lower token.
// Tx is the store's transaction type (pgx.Tx for PostgreSQL, *sql.Tx for SQLite).
//
// All methods are safe for concurrent use; concurrent writers to the same key are serialized by
// the store, and a lower token can never commit after a higher one was accepted.
type Sink[Tx any] interface {
	// Claim takes the fence for claimant with token t, in one atomic step, and returns the
	// state as it stands afterwards (its Position is where the new owner resumes). It
	// accepts a token higher than the stored one, and the stored token itself only when
	// claimant already holds it (an idempotent re-claim, e.g. after a lost reply) or nobody
	// does (the zero token of a fence never claimed). So at most one claimant ever holds a
	// given token. A lower stored token, or an equal one held by another claimant, fails
	// with a *StaleError (errors.Is ErrStale) and changes nothing. claimant must be a valid
	// identifier (non-empty, at most 1024 bytes of UTF-8 without NUL).
	Claim(ctx context.Context, k Key, t Token, claimant string) (State, error)
	// Load returns the stored state; a key never claimed has the zero token, NoPosition and
	// no claimant.
	Load(ctx context.Context, k Key) (State, error)
	// Apply runs fn in a new transaction after checking and advancing the fence over the
	// batch of positions first..last, and commits both or neither. t must equal the stored
	// token: a lower one fails with a *StaleError, a higher one with ErrNotClaimed (writes
	// happen only under a claimed token). A batch at or below the stored position fails
	// with ErrDuplicate (skip it); a batch that spans it (first <= stored < last) with
	// ErrOverlap (reload and apply only the records after the stored position). Positions
	// may have gaps: first need only be above the stored position. fn's error fails it too;
	// in each case nothing is committed.
	Apply(ctx context.Context, k Key, t Token, first, last int64, fn func(ctx context.Context, tx Tx) error) error
	// Advance is Apply's check-and-advance inside a transaction the caller holds. On error
	// the caller must roll back. The fence row stays locked until the caller's transaction ends.
	Advance(ctx context.Context, tx Tx, k Key, t Token, first, last int64) error
	// Recover is the only way to accept an owner whose epoch went backwards. If the stored
	// token equals expected it stores Token{Era: expected.Era+1, Epoch: epoch} held by
	// claimant, records a [Recovery] with reason, and returns the new token; otherwise it
	// fails with ErrConflict. Callers must first prove that the presenting member is the
	// current owner.
	Recover(ctx context.Context, k Key, expected Token, epoch int64, claimant, reason string) (Token, error)
	// Recoveries lists the recorded recoveries for k, oldest first.
	Recoveries(ctx context.Context, k Key) ([]Recovery, error)
}

// Verdict is the outcome of a keyed-fence admission.
type Verdict int

const (
	Admitted  Verdict = iota + 1 // newer than anything applied: apply it
	Duplicate                    // same token, sequence at or below the stored one: drop
	Stale                        // lower token than the stored one: drop
)

func (v Verdict) String() string {
	switch v {
	case Admitted:
		return "admitted"
	case Duplicate:
		return "duplicate"
	case Stale:
		return "stale"
	}
	return "Verdict(" + strconv.Itoa(int(v)) + ")"
}

// KeyedSink keeps per-entity fences: for each (scope, id) the highest (token, sequence)
// admitted, stored atomically with the caller's own writes. It is the building block of an
// inbox: a receiver admits a message before applying its effect in the same transaction.
type KeyedSink[Tx any] interface {
	// Admit compares (t, seq) with what is stored for (scope, id) inside the caller's
	// transaction; if higher it stores it and returns Admitted, otherwise it stores nothing and
	// returns Stale (lower token) or Duplicate (same token, seq not higher). The entity row
	// stays locked until the caller's transaction ends.
	Admit(ctx context.Context, tx Tx, scope, id string, t Token, seq int64) (Verdict, error)
}
