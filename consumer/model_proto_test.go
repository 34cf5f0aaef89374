package consumer

import (
	"errors"
	"fmt"
	"strings"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/fencestore"
)

// The worker side of the model: what one partition worker does in one atomic step. Each
// sink step calls the real fencestore rule on the model's sink state.

var modelKey = fence.Key{Group: "g", Topic: "t", Partition: 0}

// A modelMutant reverts one fix of issue 10 in the model, to show that the model finds the
// finding again.
type modelMutant string

const (
	// Finding 1, in the sink: an equal token is accepted from any claimant and Advance
	// checks only the batch's last position (CheckClaim is called as if the presenter held
	// the stored token; CheckAdvance as if the batch began after the stored position).
	mutEqualTokenAnyClaimant modelMutant = "equal-token-any-claimant"
	// Finding 2: the Heartbeat proof, answered blindly by a loading coordinator.
	mutBlindProof modelMutant = "blind-proof"
	// Finding 2, related: no proof after a successful claim (a member of an old group
	// incarnation whose generation climbed past the stored epoch applies).
	mutNoVerifyAfterClaim modelMutant = "no-verify-after-claim"
	// Finding 2, related: a current owner refused at a write stops instead of re-claiming.
	mutStaleWriteStops modelMutant = "stale-write-stops"
	// Finding 3: a Recover conflict is retried with the same expected token.
	mutRecoverConflictRetried modelMutant = "recover-conflict-retried"
	// Finding 4: a proof at the assignment epoch that fails while the coordinator still
	// assigns P to this member (retained at a later generation) stops the partition.
	mutRetainedIdles modelMutant = "retained-idles"
	// A relay Flush refused as stale is retried until the next record (no re-claim).
	mutRelayNoReclaim modelMutant = "relay-no-reclaim"
)

type protocol struct {
	name string
	mut  map[modelMutant]bool
}

func realProtocol() protocol { return protocol{name: "issue-10"} }

func mutantProtocol(ms ...modelMutant) protocol {
	p := protocol{mut: map[modelMutant]bool{}}
	var names []string
	for _, m := range ms {
		p.mut[m] = true
		names = append(names, string(m))
	}
	p.name = "mutant " + strings.Join(names, "+")
	return p
}

type wstep struct {
	what      string
	next      mstate
	replyLost bool
	violation string
}

func (p protocol) claimRule(s mstate, t tok8, claimant int8) error {
	st := s.sinkState()
	c := claimantOf(claimant)
	if p.mut[mutEqualTokenAnyClaimant] && t == s.sTok {
		c = st.Claimant
	}
	return fencestore.CheckClaim(modelKey, st, t.token(), c)
}

func (p protocol) advanceRule(s mstate, t tok8, first, last int8) error {
	if p.mut[mutEqualTokenAnyClaimant] && first <= s.sPos && s.sPos < last {
		first = s.sPos + 1
	}
	return fencestore.CheckAdvance(modelKey, s.sinkState(), t.token(), int64(first), int64(last))
}

// proofAnswer is the coordinator's answer to the proof of currentness: an OffsetCommit at
// the worker's epoch naming P (refused with COORDINATOR_LOAD_IN_PROGRESS while loading) plus
// DescribeGroups (is P in the member's assignment).
type proofAnswer struct {
	cannotTell, known, genOK, assigned bool
	gen                                int8
}

func (p protocol) proof(s mstate, i int) proofAnswer {
	w := s.w[i]
	if s.loading {
		if p.mut[mutBlindProof] {
			return proofAnswer{known: true, genOK: true, assigned: true, gen: w.epoch}
		}
		return proofAnswer{cannotTell: true}
	}
	known := w.member != 0 && s.member[i] == w.member
	a := proofAnswer{known: known, genOK: known && s.gen == w.epoch, assigned: known && int(s.owner) == i, gen: s.gen}
	if p.mut[mutBlindProof] {
		a.assigned = a.genOK // the Heartbeat does not look at the assignment
	}
	return a
}

func (p protocol) step(s mstate, i int, canFault bool) []wstep {
	w := s.w[i]
	n := s
	nw := &n.w[i]
	one := func(what string, v string) []wstep { return []wstep{{what: what, next: n, violation: v}} }
	switch w.pc {
	case pcLoad:
		tok := tok8{era: s.sTok.era, epoch: w.epoch}
		nw.tok, nw.pc = tok, pcClaim
		return one(sayf("load %s, will claim %s", s.sTok, tok), "")
	case pcClaim:
		err := p.claimRule(s, w.tok, w.id)
		if err == nil {
			n.took(i, w.tok, false)
			nw.pos, nw.seen = s.sPos, tok8{}
			if p.mut[mutNoVerifyAfterClaim] {
				nw.pc = pcRun
				return one(sayf("claim %s ok, position %d", w.tok, s.sPos), "")
			}
			nw.pc, nw.claimedOK = pcVerify, true
			return one(sayf("claim %s ok, position %d; prove currentness before applying", w.tok, s.sPos), "")
		}
		var se *fence.StaleError
		if errors.As(err, &se) {
			nw.seen, nw.pc, nw.claimedOK = s.sTok, pcVerify, false
			return one(sayf("claim %s refused (stored %s held by %s)", w.tok, s.sTok, claimantOf(s.sClaimant)), "")
		}
		return one("claim: "+err.Error(), "claim refused: "+err.Error())
	case pcVerify:
		a := p.proof(s, i)
		switch {
		case a.cannotTell:
			return nil // retried until the coordinator can tell
		case a.genOK && a.assigned:
			nw.proof = proofSound
			if !(s.current(i) && s.gen == w.epoch) {
				nw.proof = proofUnsound
			}
			if w.claimedOK {
				nw.pc = pcRun
				return one(sayf("proof at gen %d: current; apply", w.epoch), "")
			}
			nw.pc = pcRecover
			return one(sayf("proof at gen %d: current; recover from %s", w.epoch, w.seen), "")
		case a.known && a.assigned && !p.mut[mutRetainedIdles]:
			nw.epoch, nw.pc, nw.claimedOK = a.gen, pcLoad, false
			return one(sayf("proof at gen %d: the coordinator still assigns P at gen %d: re-derive the epoch", w.epoch, a.gen), "")
		}
		nw.pc = pcStopped
		return one(sayf("proof at gen %d: not current; stop", w.epoch), "")
	case pcRecover:
		if s.sTok != w.seen {
			if p.mut[mutRecoverConflictRetried] {
				return nil // the same compare-and-set again: no change
			}
			nw.pc = pcLoad
			return one(sayf("recover from %s: conflict (stored %s), reload", w.seen, s.sTok), "")
		}
		to := tok8{era: w.seen.era + 1, epoch: w.epoch}
		var v string
		if w.proof != proofSound {
			v = fmt.Sprintf("era raised to %s by w%d, whose proof of currentness was answered for a member that is not current", to, w.id)
		}
		n.took(i, to, true)
		var out []wstep
		if canFault { // the recovery commits, its reply is lost: the worker retries it
			out = append(out, wstep{what: sayf("recover %s -> %s", w.seen, to), next: n, replyLost: true, violation: v})
		}
		nw.tok, nw.pc, nw.pos = to, pcRun, s.sPos
		return append(out, wstep{what: sayf("recover %s -> %s, position %d", w.seen, to, s.sPos), next: n, violation: v})
	case pcRun:
		var out []wstep
		for last := w.pos + 1; last < logLen; last++ {
			n := s
			nw := &n.w[i]
			first := w.pos + 1
			err := p.advanceRule(s, w.tok, first, last)
			what := sayf("apply %d..%d under %s: ", first, last, w.tok)
			switch {
			case err == nil:
				v := n.commit(i, first, last)
				out = append(out, wstep{what: what + "committed", next: n, violation: v})
			case errors.Is(err, fence.ErrDuplicate):
				nw.pos = last
				out = append(out, wstep{what: what + "duplicate, skipped", next: n})
			case errors.Is(err, fence.ErrOverlap):
				nw.pos = s.sPos
				out = append(out, wstep{what: what + "overlap, reload", next: n})
			case errors.Is(err, fence.ErrStale), errors.Is(err, fence.ErrNotClaimed):
				if p.mut[mutStaleWriteStops] {
					nw.pc = pcStopped
					out = append(out, wstep{what: what + "refused (" + err.Error() + "), stop", next: n})
					break
				}
				nw.pc, nw.claimedOK = pcLoad, false
				out = append(out, wstep{what: what + "refused (" + err.Error() + "), re-claim", next: n})
			default:
				out = append(out, wstep{what: what + err.Error(), next: n, violation: "apply: " + err.Error()})
			}
		}
		return out
	}
	return nil
}
