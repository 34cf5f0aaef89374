package consumer

import (
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/claimant"
)

// The claim decision: which step a partition's worker takes next to become (or stay) the
// fence's writer, as a pure function of what it knows and what its last step returned. The
// runtime (worker.settle) executes the steps against the sink and the group coordinator; a
// model checker can call the same function over every interleaving.
//
// The decision never decides who may write by comparing tokens itself: whether a stored token
// equal to ours belongs to us is decided by the sink, atomically, from the claimant stored with
// it (Claim refuses an equal token held by another claimant); the comparisons it makes (was
// the refused token ours? is the stored one higher only by its era?) only choose how a
// refusal is reported and recovered. A refusal, of a claim or of a write, is never taken
// as proof of anything: only the coordinator tells a zombie (give up) from a current owner
// whose epoch source went backwards (recover), and a partition this member still owns at a
// later generation (re-derive the epoch and claim again) from one it lost.
//
// A claim refused because the stored token equals ours while another claimant holds it is
// told apart by who that claimant is: a claimant of this member's own identity (the same
// group.instance.id, or the same member id: see internal/claimant) is this member's previous
// worker, handing the partition over at the same generation (a static member restarted
// without a rebalance, a KIP-848 member rejoining in place); any other is an epoch source
// that went backwards (a recreated group back at the stored generation). Both are recovered
// the same way, only after the coordinator's proof and only by a compare-and-set that moves
// the era (the era is what fences the previous claimant, which holds the very token we
// present); they differ in how they are reported, and a handover is not a regression, so
// RecoverRegressions(false) does not stop it.

// claimOp is what the runtime does next.
type claimOp int

const (
	opLoad    claimOp = iota + 1 // Load the fence (its era, for our token)
	opClaim                      // Claim(step.Token) as this worker's claimant
	opVerify                     // prove with the coordinator that this member owns the partition at step.Epoch
	opRecover                    // Recover(step.Token -> {step.Token.Era+1, step.Epoch}) as this worker's claimant (step.Handover: a same-generation handover)
	opProceed                    // claimed and verified: apply records under the claimed token
	opGiveUp                     // stop the partition (step.Why says why)
	opTopic                      // compare the topic the partition is read from with the identity stored with the fences
	opHold                       // the topic was recreated or grown: apply nothing, look again later (step.Why says why)
)

// claimEvent is the outcome of the step just executed.
type claimEvent int

const (
	evStart          claimEvent = iota + 1 // a new assignment, or a write refused as not claimed: decide afresh
	evLoaded                               // Load returned in.State
	evClaimed                              // Claim accepted; in.State is the state afterwards
	evClaimStale                           // Claim refused (*fence.StaleError); in.Stored is the stored token, in.Presented ours
	evWriteStale                           // a write under the claimed token was refused as stale; in.Stored
	evCurrent                              // the coordinator confirms: this member owns the partition at the epoch
	evRetained                             // it owns it, at the later generation in.Generation
	evNotCurrent                           // the coordinator refuses: another member owns it, or we left the group
	evRecovered                            // Recover returned in.Token
	evConflict                             // Recover lost its compare-and-set (the stored token moved)
	evTopicSame                            // the topic is the one stored with the fences, the partition below its acknowledged count
	evTopicRecreated                       // the topic has another ID than the one stored with the fences
	evTopicGrown                           // the partition is at or above the topic's acknowledged partition count
)

// claimInput is an event and its data.
type claimInput struct {
	Event      claimEvent
	State      fence.State // evLoaded, evClaimed
	Stored     fence.Token // evClaimStale, evWriteStale
	Presented  fence.Token // evClaimStale: the token the refused claim presented
	Token      fence.Token // evRecovered
	Generation int64       // evRetained
}

// claimStep is what to do next.
type claimStep struct {
	Op    claimOp
	Token fence.Token // opClaim: the token to claim; opRecover: the expected (stored) token
	Epoch int64       // opVerify: the epoch to prove; opRecover: the new token's epoch
	Why   giveUp      // opGiveUp
	// Handover (opRecover): the stored token equals ours and is held by a claimant of this
	// member's identity: a same-generation handover, reported as such, not as a regression.
	Handover bool
}

// giveUp says why a partition is stopped.
type giveUp int

const (
	giveUpNotCurrent giveUp = iota + 1 // the coordinator says another member owns it: a zombie
	giveUpNoRecovery                   // a regression, and RecoverRegressions is off
	giveUpConflicts                    // Recover lost its compare-and-set too many times in a row
	giveUpRederived                    // the epoch was re-derived too many times in a row
	holdRecreated                      // opHold: the topic was recreated (until an operator resets it)
	holdGrown                          // opHold: the topic was grown (until an operator acknowledges it)
)

// Bounds of the decision's loops. Each turn of either loop is a fresh Load and Claim (never a
// retry of a compare-and-set that lost), so the bounds are only a guard against a partition
// churning for ever; the runtime backs off between turns.
const (
	maxConflicts = 8
	maxRederived = 8
)

// claimState is what the decision remembers between steps. It is a value: the model checker
// copies it freely.
type claimState struct {
	Epoch     int64       // the epoch our tokens carry: the generation at assignment, or a re-derived one
	Recover   bool        // RecoverRegressions
	Claimed   bool        // our last claim was accepted and no write was refused since
	Refused   bool        // our last claim or write was refused as stale
	Stale     fence.Token // the stored token of that refusal
	Conflicts int         // Recover conflicts in a row
	Rederived int         // epoch re-derivations in a row
	Token     fence.Token // the token of our last accepted claim
	Confirm   bool        // the pending Load confirms that the fence still holds Token
	// Identity is this member's identity (memberIdentity): a claimant of it is this member's
	// own previous worker. "" (unknown) never matches.
	Identity string
	// Identify: the pending Load reads who holds Stale, the token equal to ours that our claim
	// was refused (at one token the holder never changes: only Recover, which moves the era,
	// gives a token another holder).
	Identify bool
	// Handover: the refusal of Stale is a same-generation handover (Identify found a claimant
	// of our identity holding it).
	Handover bool
	Holder   string // the claimant Identify found holding Stale (for the report only)
	// Equal: the last refusal was of a claim at the very token stored (held by another).
	Equal bool
}

// decideClaim returns the next state and step after in.
func decideClaim(s claimState, in claimInput) (claimState, claimStep) {
	switch in.Event {
	case evStart:
		s.Claimed, s.Refused, s.Confirm, s.Identify, s.Handover = false, false, false, false, false
		return s, claimStep{Op: opLoad}
	case evLoaded:
		if s.Identify {
			s.Identify = false
			if in.State.Token == s.Stale {
				// The holder of the token our claim was refused: our own identity's previous
				// worker makes this a handover. Either way only the coordinator's proof lets
				// us recover; a handover skips nothing but the ERROR.
				s.Holder = in.State.Claimant
				s.Handover = claimant.Same(s.Identity, in.State.Claimant)
				return s, claimStep{Op: opVerify, Epoch: s.Epoch}
			}
			// The fence moved since the refusal (a recovery, a reset): as after a confirming
			// Load that finds another token, only the coordinator tells whether to claim
			// afresh or stop.
			s.Claimed, s.Refused = false, false
			return s, claimStep{Op: opVerify, Epoch: s.Epoch}
		}
		if s.Confirm {
			s.Confirm = false
			if in.State.Token == s.Token {
				// Still our token (at most one claimant ever holds a token): no reset of the
				// topic came between the claim and the comparison, so the position the claim
				// returned counts the offsets of the incarnation just compared. Verified after
				// every successful claim, before the first write: an accepted claim proves only
				// that nobody stored a higher token (a member of an older incarnation of a
				// recreated group can climb past the stored epoch; only the coordinator knows).
				return s, claimStep{Op: opVerify, Epoch: s.Epoch}
			}
			// The fence moved since our claim (a reset, or another member's claim): only the
			// coordinator tells whether we still own the partition (then we load and claim
			// afresh) or are a zombie (then we stop). Claiming afresh at once would let a
			// zombie climb into every era its successor recovers into.
			s.Claimed, s.Refused = false, false
			return s, claimStep{Op: opVerify, Epoch: s.Epoch}
		}
		return s, claimStep{Op: opClaim, Token: fence.Token{Era: in.State.Token.Era, Epoch: s.Epoch}}
	case evClaimed:
		// The topic is compared after every successful claim, before the first write: an
		// operator's reset of a recreated topic moves every fence of the topic to a new era,
		// so a claim accepted before the reset can never write after it, and a claim
		// accepted after it sees the reset identity. Compared before the claim instead, a
		// reset between the two would let records of the old incarnation in at the new
		// incarnation's positions.
		s.Claimed, s.Refused, s.Token, s.Handover = true, false, in.State.Token, false
		return s, claimStep{Op: opTopic}
	case evTopicSame:
		// The topic is the one stored with the fences, but an operator's reset may have come
		// between our claim and the comparison: the claim's position would then count the
		// old incarnation's offsets, and the records of the new one at or below it would be
		// filtered out as applied, never reaching the sink to be refused. A reset moves the
		// fence to a new era, so a Load that still finds our token proves there was none.
		s.Confirm = true
		return s, claimStep{Op: opLoad}
	case evTopicRecreated:
		// The fences' positions are offsets of another incarnation of the topic: resuming
		// from them would skip this one's records. Nothing is applied until an operator
		// resets the topic's identity, which moves the fences to a new era; the runtime
		// looks again (evStart) after a while.
		s.Claimed = false
		return s, claimStep{Op: opHold, Why: holdRecreated}
	case evTopicGrown:
		// Keys moved here from the older partitions, whose backlog may hold their earlier
		// records: applying this partition now would make two writers for a moved key.
		s.Claimed = false
		return s, claimStep{Op: opHold, Why: holdGrown}
	case evClaimStale, evWriteStale:
		s.Claimed, s.Refused, s.Stale, s.Handover = false, true, in.Stored, false
		s.Equal = in.Event == evClaimStale && in.Stored == in.Presented
		if s.Equal {
			// Our very token, held by another claimant: learn who holds it before asking the
			// coordinator (a write is never refused at an equal token).
			s.Identify = true
			return s, claimStep{Op: opLoad}
		}
		return s, claimStep{Op: opVerify, Epoch: s.Epoch}
	case evCurrent:
		s.Rederived = 0
		switch {
		case s.Claimed:
			s.Conflicts = 0
			return s, claimStep{Op: opProceed}
		case !s.Refused:
			return s, claimStep{Op: opLoad}
		case !s.Equal && s.Stale.Epoch <= s.Epoch:
			// The stored token is higher only by its era: its epoch is not above ours, so no
			// epoch went backwards; the era moved between our Load and our claim or write (a
			// handover or a recovery by an owner before us, an operator's reset). Load and
			// claim again at the stored era, as a current owner: a token above the stored
			// one, which the sink accepts without a recovery, or the stored token itself,
			// whose holder the equal-token path then tells apart. (A recovery here would leave
			// the next owner stuck with RecoverRegressions(false) when a handover races a
			// rebalance or a second replacement, and move one era too many otherwise: the model
			// check, TestModelStaticHandover, shows both.)
			if s.Conflicts++; s.Conflicts > maxConflicts {
				return s, claimStep{Op: opGiveUp, Why: giveUpConflicts}
			}
			s.Refused = false
			return s, claimStep{Op: opLoad}
		case !s.Recover && !s.Handover:
			return s, claimStep{Op: opGiveUp, Why: giveUpNoRecovery}
		}
		// Current, yet the sink holds a higher token or ours for another claimant: our own
		// previous worker (a handover: a static member replaced, a KIP-848 member rejoined in
		// place), an epoch source that went backwards (a recreated group), or a non-current
		// member that raised the era. Move to a new era from exactly what is stored: the
		// new era is what fences the previous holder, which holds the token we present.
		return s, claimStep{Op: opRecover, Token: s.Stale, Epoch: s.Epoch, Handover: s.Handover}
	case evRetained:
		// Still ours at a later generation (kept across a rebalance under cooperative-sticky
		// assignment): that generation is a token the coordinator vouches for. Claim again.
		if s.Rederived++; s.Rederived > maxRederived {
			return s, claimStep{Op: opGiveUp, Why: giveUpRederived}
		}
		s.Epoch, s.Claimed, s.Refused, s.Handover = in.Generation, false, false, false
		return s, claimStep{Op: opLoad}
	case evNotCurrent:
		return s, claimStep{Op: opGiveUp, Why: giveUpNotCurrent}
	case evRecovered:
		// Recover stored in.Token for our claimant; claiming it is an idempotent re-claim
		// that also returns the position, and the claim is verified like any other.
		return s, claimStep{Op: opClaim, Token: in.Token}
	case evConflict:
		// The stored token moved: someone claimed or recovered meanwhile, or our own
		// Recover committed and its reply was lost. Retrying the same compare-and-set can
		// never succeed; reload and decide again.
		if s.Conflicts++; s.Conflicts > maxConflicts {
			return s, claimStep{Op: opGiveUp, Why: giveUpConflicts}
		}
		s.Claimed, s.Refused, s.Handover = false, false, false
		return s, claimStep{Op: opLoad}
	}
	panic("consumer: unknown claim event")
}
