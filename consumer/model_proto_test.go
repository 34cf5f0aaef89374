package consumer

import (
	"errors"
	"strings"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/fencecheck"
)

// The worker side of the model: what one partition worker does in one atomic step. Each sink
// step calls the real fencecheck rule on the model's sink state, and every claim step's
// outcome goes through the consumer's real claim decision (decideClaim), which says what the
// worker does next. The coordinator's answer to the proof of ownership is the model's
// abstraction of ClassicGeneration.VerifyCurrent (see proof).

var modelKey = fence.Key{Group: "g", Topic: "t", Partition: 0}

// A modelMutant breaks one rule in the model's own copy of the protocol (the runtime, the
// coordinator's proof, the claim's retry), to show that the model finds the counterexample.
// The production rules are broken by the patches of internal/testkit/mutants, which
// TestModelTargetedFaults and the consumer's tests catch; a patch never edits the model.
type modelMutant string

const (
	// No proof after a successful claim (a member of an old group
	// incarnation whose generation climbed past the stored epoch applies).
	mutNoVerifyAfterClaim modelMutant = "no-verify-after-claim"
	// A current owner refused at a write stops instead of re-claiming.
	mutStaleWriteStops modelMutant = "stale-write-stops"
	// A proof at the assignment epoch that fails while the coordinator still
	// assigns P to this member (retained at a later generation) stops the partition.
	mutRetainedIdles modelMutant = "retained-idles"
	// A relay Flush (AfterCommit)
	// refused as stale was only logged and retried at the next idle tick, so an owner with
	// nothing left to apply did not notice that a zombie's late claim took the fence, and its
	// outbox rows waited for the next record. The runtime re-runs the claim decision.
	mutRelayNoReclaim modelMutant = "relay-no-reclaim" // a relay Flush refused as stale only logged
	// Currentness proven with a Heartbeat at the epoch, which a loading coordinator answers
	// with no error for any member and generation.
	mutBlindProof modelMutant = "blind-proof"
	// An equal token held by another claimant taken over: the worker re-claims as the
	// stored claimant.
	mutEqualTokenTakeover modelMutant = "equal-token-takeover"
	// Records fetched from another topic ID than the claim compared applied without
	// comparing the topic again.
	mutBatchTopicUnchecked modelMutant = "batch-topic-unchecked"
)

type protocol struct {
	name string
	mut  map[modelMutant]bool
}

func realProtocol() protocol { return protocol{name: "runtime"} }

func mutantProtocol(ms ...modelMutant) protocol {
	p := protocol{mut: map[modelMutant]bool{}}
	var names []string
	for _, m := range ms {
		p.mut[m] = true
		names = append(names, string(m))
	}
	p.name = "model mutant " + strings.Join(names, "+")
	return p
}

type wstep struct {
	what      string
	next      mstate
	replyLost bool
	violation string
}

// claimStateOf and setClaimState convert between the decision's claimState and the model's
// compact copy of it.
func (w *wstate) claimState() claimState {
	return claimState{Epoch: int64(w.epoch), Recover: !w.norec, Claimed: w.claimedOK, Refused: w.refused,
		Stale: w.seen.token(), Conflicts: int(w.conflicts), Rederived: int(w.rederived),
		Token: w.tok.token(), Confirm: w.confirm,
		Identity: identityName(w.inst), Identify: w.identify, Handover: w.handover, Equal: w.equal}
}

func (w *wstate) decide(in claimInput) {
	cs, step := decideClaim(w.claimState(), in)
	w.epoch, w.claimedOK, w.refused = int8(cs.Epoch), cs.Claimed, cs.Refused
	w.seen, w.conflicts, w.rederived = tok8of(cs.Stale), int8(cs.Conflicts), int8(cs.Rederived)
	w.tok, w.confirm = tok8of(cs.Token), cs.Confirm
	w.identify, w.handover, w.equal = cs.Identify, cs.Handover, cs.Equal
	switch step.Op {
	case opLoad:
		w.pc = pcLoad
	case opClaim:
		w.pc, w.tok = pcClaim, tok8of(step.Token)
	case opVerify:
		w.pc, w.vepoch = pcVerify, int8(step.Epoch)
	case opRecover:
		w.pc, w.exp, w.vepoch = pcRecover, tok8of(step.Token), int8(step.Epoch)
	case opProceed:
		w.pc = pcRun
	case opGiveUp:
		w.pc = pcStopped
	case opTopic:
		w.pc = pcTopic
	case opHold:
		w.pc = pcHold
	default:
		panic("model: unknown claim step")
	}
}

func (p protocol) claimRule(s mstate, t tok8, claimant, inst int8) error {
	st := s.sinkState()
	c := claimantOf(claimant, inst)
	err := fencecheck.CheckClaim(modelKey, st, t.token(), c)
	var se *fence.StaleError
	if p.mut[mutEqualTokenTakeover] && errors.As(err, &se) && se.Stored == t.token() && st.Claimant != "" {
		return fencecheck.CheckClaim(modelKey, st, t.token(), st.Claimant)
	}
	return err
}

// proof is the coordinator's answer to ClassicGeneration.VerifyCurrent(P, epoch) for the
// worker in slot i: an OffsetCommit as the member at epoch naming P (and, if refused while
// the member's generation is later, at that generation) plus DescribeGroups (P in the
// member's assignment). While the coordinator loads the group it cannot tell (the commit is
// refused with COORDINATOR_LOAD_IN_PROGRESS), and the worker retries.
func (p protocol) proof(s mstate, i int, epoch int8) (owned int8, ok, cannotTell bool) {
	w := s.w[i]
	if p.mut[mutBlindProof] {
		return epoch, s.loading || (w.member != 0 && s.member[i] == w.member && s.gen == epoch), false
	}
	if s.loading {
		return 0, false, true
	}
	known := w.member != 0 && s.member[i] == w.member
	if !known || int(s.owner) != i {
		return 0, false, false
	}
	if s.gen != epoch && p.mut[mutRetainedIdles] {
		return 0, false, false
	}
	return s.gen, true, false
}

func (p protocol) step(s mstate, i int, canFault bool) []wstep {
	w := s.w[i]
	n := s
	nw := &n.w[i]
	one := func(what string, v string) []wstep { return []wstep{{what: what, next: n, violation: v}} }
	switch w.pc {
	case pcLoad:
		nw.decide(claimInput{Event: evLoaded, State: s.sinkState()})
		if p.mut[mutNoVerifyAfterClaim] && w.confirm && nw.pc == pcVerify && nw.claimedOK {
			nw.decide(claimInput{Event: evCurrent}) // the claim confirmed: proceed unproven
		}
		return one(sayf("load: %s held by w%d (i%d); next %s", s.sTok, s.sClaimant, s.sInst, nw.pc), "")
	case pcClaim:
		err := p.claimRule(s, w.tok, w.id, w.inst)
		var se *fence.StaleError
		switch {
		case err == nil:
			n.took(i, w.tok, false)
			nw.pos = s.sPos
			nw.decide(claimInput{Event: evClaimed, State: n.sinkState()})
			if nw.pc == pcTopic && s.tinc == 0 {
				// Topics not modelled: the comparison is a no-op, folded into the claim
				// (one state fewer per claim).
				nw.decide(claimInput{Event: evTopicSame})
			}

			return one(sayf("claim %s: ok, position %d; next %s", w.tok, s.sPos, nw.pc), "")
		case errors.As(err, &se):
			nw.decide(claimInput{Event: evClaimStale, Stored: se.Stored, Presented: se.Presented})
			return one(sayf("claim %s: refused (stored %s held by w%d); next %s", w.tok, s.sTok, s.sClaimant, nw.pc), "")
		}
		return one("claim: "+err.Error(), "claim refused: "+err.Error())
	case pcVerify:
		owned, ok, cannotTell := p.proof(s, i, w.vepoch)
		switch {
		case cannotTell:
			return nil // retried until the coordinator can tell
		case ok && owned == w.vepoch:
			nw.proof = proofSound
			if !(s.current(i) && s.gen == w.vepoch) {
				nw.proof = proofUnsound
			}
			nw.decide(claimInput{Event: evCurrent})
		case ok:
			nw.decide(claimInput{Event: evRetained, Generation: int64(owned)})
		default:
			nw.decide(claimInput{Event: evNotCurrent})
		}
		return one(sayf("prove ownership at gen %d: owned %d ok=%v; next %s", w.vepoch, owned, ok, nw.pc), "")
	case pcRecover:
		if s.sTok != w.exp {
			nw.decide(claimInput{Event: evConflict})
			return one(sayf("recover from %s: conflict (stored %s); next %s", w.exp, s.sTok, nw.pc), "")
		}
		to := tok8{era: w.exp.era + 1, epoch: w.vepoch}
		var v string
		switch w.proof {
		case proofNone:
			v = "era raised to " + to.String() + " by a worker that never proved its ownership"
		case proofUnsound:
			v = "era raised to " + to.String() + " by a worker whose proof of ownership was answered for a member that did not own the partition"
		}
		n.took(i, to, true)
		nw.proof = proofNone // consumed
		var out []wstep
		if canFault { // the recovery commits, its reply is lost: the worker retries it
			out = append(out, wstep{what: sayf("recover %s -> %s", w.exp, to), next: n, replyLost: true, violation: v})
		}
		nw.decide(claimInput{Event: evRecovered, Token: to.token()})
		return append(out, wstep{what: sayf("recover %s -> %s; next %s", w.exp, to, nw.pc), next: n, violation: v})
	case pcTopic:
		if s.tinc == 0 { // topics not modelled: the sink does not store them
			nw.decide(claimInput{Event: evTopicSame})
			return one("topic: not stored", "")
		}
		ev := n.topicCheck(0)
		nw.tview = s.tinc
		nw.decide(claimInput{Event: ev})
		return one(sayf("compare topic (incarnation %d) with the stored %d: next %s", s.tinc, n.sTopic, nw.pc), "")
	case pcHold:
		nw.decide(claimInput{Event: evStart})
		return one("held: look again", "")
	case pcRun:
		if s.tinc != 0 && w.tview != 0 && w.tview != s.tinc && !p.mut[mutBatchTopicUnchecked] {
			// Records fetched from another topic ID than the claim compared: compare again.
			nw.decide(claimInput{Event: evStart})
			return one(sayf("fetched records of incarnation %d, claim compared %d: re-claim", s.tinc, w.tview), "")
		}
		var out []wstep
		for last := w.pos + 1; last < logLen; last++ {
			n := s
			nw := &n.w[i]
			first := w.pos + 1
			err := fencecheck.CheckAdvance(modelKey, s.sinkState(), w.tok.token(), int64(first), int64(last))
			what := sayf("apply %d..%d under %s: ", first, last, w.tok)
			var se *fence.StaleError
			switch {
			case err == nil:
				v := n.commit(i, first, last)
				out = append(out, wstep{what: what + "committed", next: n, violation: v})
				continue
			case errors.Is(err, fence.ErrDuplicate):
				nw.pos = last
			case errors.Is(err, fence.ErrOverlap):
				nw.pos = s.sPos
			case p.mut[mutStaleWriteStops] && (errors.Is(err, fence.ErrStale) || errors.Is(err, fence.ErrNotClaimed)):
				nw.pc = pcStopped
			case errors.As(err, &se):
				nw.decide(claimInput{Event: evWriteStale, Stored: se.Stored})
			case errors.Is(err, fence.ErrNotClaimed):
				nw.decide(claimInput{Event: evStart})
			default:
				out = append(out, wstep{what: what + err.Error(), next: n, violation: "apply: " + err.Error()})
				continue
			}
			out = append(out, wstep{what: what + sayf("%v; next %s", errors.Unwrap(err), nw.pc), next: n})
		}
		return out
	}
	return nil
}
