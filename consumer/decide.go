package consumer

import "github.com/batonhq/baton/fence"

// The claim decision: which step a partition's worker takes next to become (or stay) the
// fence's writer, as a pure function of what it knows and what its last step returned. The
// runtime (worker.settle) executes the steps against the sink and the group coordinator; a
// model checker can call the same function over every interleaving.
//
// The decision never compares tokens itself: whether a stored token equal to ours belongs to
// us is decided by the sink, atomically, from the claimant stored with it (Claim refuses an
// equal token held by another claimant). A refusal, of a claim or of a write, is never taken
// as proof of anything: only the coordinator tells a zombie (give up) from a current owner
// whose epoch source went backwards (recover), and a partition this member still owns at a
// later generation (re-derive the epoch and claim again) from one it lost.

// claimOp is what the runtime does next.
type claimOp int

const (
	opLoad    claimOp = iota + 1 // Load the fence (its era, for our token)
	opClaim                      // Claim(step.Token) as this worker's claimant
	opVerify                     // prove with the coordinator that this member owns the partition at step.Epoch
	opRecover                    // Recover(step.Token -> {step.Token.Era+1, step.Epoch}) as this worker's claimant
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
	evClaimStale                           // Claim refused (*fence.StaleError); in.Stored is the stored token
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
	Token      fence.Token // evRecovered
	Generation int64       // evRetained
}

// claimStep is what to do next.
type claimStep struct {
	Op    claimOp
	Token fence.Token // opClaim: the token to claim; opRecover: the expected (stored) token
	Epoch int64       // opVerify: the epoch to prove; opRecover: the new token's epoch
	Why   giveUp      // opGiveUp
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
}

// decideClaim returns the next state and step after in.
func decideClaim(s claimState, in claimInput) (claimState, claimStep) {
	switch in.Event {
	case evStart:
		s.Claimed, s.Refused, s.Confirm = false, false, false
		return s, claimStep{Op: opLoad}
	case evLoaded:
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
		s.Claimed, s.Refused, s.Token = true, false, in.State.Token
		if is(mutantTopicUnchecked) {
			return s, claimStep{Op: opVerify, Epoch: s.Epoch}
		}
		return s, claimStep{Op: opTopic}
	case evTopicSame:
		// The topic is the one stored with the fences, but an operator's reset may have come
		// between our claim and the comparison: the claim's position would then count the
		// old incarnation's offsets, and the records of the new one at or below it would be
		// filtered out as applied, never reaching the sink to be refused. A reset moves the
		// fence to a new era, so a Load that still finds our token proves there was none.
		if is(mutantTopicNotConfirmed) {
			return s, claimStep{Op: opVerify, Epoch: s.Epoch}
		}
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
		if is(mutantGrowthUnheld) {
			return s, claimStep{Op: opVerify, Epoch: s.Epoch}
		}
		s.Claimed = false
		return s, claimStep{Op: opHold, Why: holdGrown}
	case evClaimStale, evWriteStale:
		s.Claimed, s.Refused, s.Stale = false, true, in.Stored
		if is(mutantStaleIsRegression) {
			return decideClaim(s, claimInput{Event: evCurrent})
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
		case !s.Recover:
			return s, claimStep{Op: opGiveUp, Why: giveUpNoRecovery}
		}
		// Current, yet the sink holds a higher token or ours for another claimant: the
		// epoch source went backwards (a recreated group, a replaced static member), or a
		// non-current member raised the era. Move to a new era from exactly what is stored.
		return s, claimStep{Op: opRecover, Token: s.Stale, Epoch: s.Epoch}
	case evRetained:
		// Still ours at a later generation (kept across a rebalance under cooperative-sticky
		// assignment): that generation is a token the coordinator vouches for. Claim again.
		if s.Rederived++; s.Rederived > maxRederived {
			return s, claimStep{Op: opGiveUp, Why: giveUpRederived}
		}
		s.Epoch, s.Claimed, s.Refused = in.Generation, false, false
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
		if is(mutantRecoverSameExpected) {
			return s, claimStep{Op: opRecover, Token: s.Stale, Epoch: s.Epoch}
		}
		s.Claimed, s.Refused = false, false
		return s, claimStep{Op: opLoad}
	}
	panic("consumer: unknown claim event")
}
