package consumer

import (
	"errors"
	"fmt"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/fencestore"
)

// specProtocol is issue 10's protocol as specified, written before the implementation
// landed (scaffolding: its sink rules wrap the pre-issue-10 fencestore functions with the
// claimant and first..last rules added here). It lets the model check the design itself.
func specProtocol() protocol { return protocol{name: "spec", step: specStep, relayReclaims: true} }

var (
	errSpecNotClaimed = errors.New("not claimed")
	errSpecOverlap    = errors.New("overlap")
)

func specClaimRule(s mstate, t tok8, claimant int8) error {
	st := s.sinkState()
	if t == s.sTok && s.sClaimant != claimant && !(s.sClaimant == 0 && s.sTok == tok8{}) {
		return &fence.StaleError{Key: modelKey, Stored: st.Token, Presented: t.token()}
	}
	return fencestore.CheckClaim(modelKey, st, t.token())
}

func specAdvanceRule(s mstate, t tok8, first, last int8) error {
	if t.less(s.sTok) {
		return &fence.StaleError{Key: modelKey, Stored: s.sTok.token(), Presented: t.token()}
	}
	if t != s.sTok {
		return errSpecNotClaimed
	}
	if last <= s.sPos {
		return fence.ErrDuplicate
	}
	if first <= s.sPos {
		return errSpecOverlap
	}
	return nil
}

// verdictOf is the coordinator's answer to the non-blind proof (an OffsetCommit at the
// worker's epoch naming P, plus DescribeGroups): cannot tell while loading; otherwise whether
// the member is known, whether the generation matches, whether P is in its assignment.
type proofAnswer struct {
	cannotTell, known, genOK, assigned bool
	gen                                int8
}

func specProof(s mstate, i int) proofAnswer {
	w := s.w[i]
	if s.loading {
		return proofAnswer{cannotTell: true}
	}
	known := w.member != 0 && s.member[i] == w.member
	return proofAnswer{known: known, genOK: known && s.gen == w.epoch, assigned: known && int(s.owner) == i, gen: s.gen}
}

func specStep(s mstate, i int, canFault bool) []wstep {
	w := s.w[i]
	n := s
	nw := &n.w[i]
	one := func(what string, v string) []wstep { return []wstep{{what: what, next: n, violation: v}} }
	switch w.pc {
	case pcLoad:
		tok := tok8{era: s.sTok.era, epoch: w.epoch}
		nw.tok, nw.pc = tok, pcClaim
		return one(fmt.Sprintf("load %s, will claim %s", s.sTok, tok), "")
	case pcClaim:
		err := specClaimRule(s, w.tok, w.id)
		if err == nil {
			n.took(i, w.tok, false)
			nw.pos, nw.pc, nw.seen = s.sPos, pcVerify, tok8{}
			nw.claimedOK = true
			out := one(fmt.Sprintf("claim %s ok, position %d; verify before applying", w.tok, s.sPos), "")
			return out
		}
		var se *fence.StaleError
		if errors.As(err, &se) {
			nw.seen, nw.pc, nw.claimedOK = s.sTok, pcVerify, false
			return one(fmt.Sprintf("claim %s refused (stored %s by %s)", w.tok, s.sTok, claimantOf(s.sClaimant)), "")
		}
		return one("claim: "+err.Error(), "claim refused: "+err.Error())
	case pcVerify:
		a := specProof(s, i)
		cur := s.current(i) && s.gen == w.epoch
		switch {
		case a.cannotTell:
			return nil // retried until the coordinator can tell
		case a.genOK && a.assigned:
			if !cur {
				nw.proof = proofUnsound
			} else {
				nw.proof = proofSound
			}
			if w.claimedOK {
				nw.pc = pcRun
				return one(fmt.Sprintf("proof at gen %d: current; apply", w.epoch), "")
			}
			nw.pc = pcRecover
			return one(fmt.Sprintf("proof at gen %d: current; recover from %s", w.epoch, w.seen), "")
		case a.known && a.assigned:
			nw.epoch, nw.pc, nw.claimedOK = a.gen, pcLoad, false
			return one(fmt.Sprintf("proof at gen %d: generation moved on, P retained at %d: re-derive", w.epoch, a.gen), "")
		}
		nw.pc = pcStopped
		return one(fmt.Sprintf("proof at gen %d: not current; stop", w.epoch), "")
	case pcRecover:
		if s.sTok != w.seen {
			nw.pc = pcLoad // ErrConflict: reload and re-decide
			return one(fmt.Sprintf("recover from %s: conflict (stored %s), reload", w.seen, s.sTok), "")
		}
		to := tok8{era: w.seen.era + 1, epoch: w.epoch}
		var v string
		if w.proof != proofSound {
			v = fmt.Sprintf("era raised to %s by w%d, whose proof of currentness was not sound", to, w.id)
		}
		n.took(i, to, false)
		var out []wstep
		if canFault {
			out = append(out, wstep{what: fmt.Sprintf("recover %s -> %s", w.seen, to), next: n, replyLost: true, violation: v})
		}
		nw.tok, nw.pc, nw.pos = to, pcRun, s.sPos
		return append(out, wstep{what: fmt.Sprintf("recover %s -> %s, position %d", w.seen, to, s.sPos), next: n, violation: v})
	case pcRun:
		var out []wstep
		for last := w.pos + 1; last < logLen; last++ {
			n := s
			nw := &n.w[i]
			first := w.pos + 1
			err := specAdvanceRule(s, w.tok, first, last)
			what := fmt.Sprintf("apply %d..%d under %s: ", first, last, w.tok)
			switch {
			case err == nil:
				v := n.commit(i, first, last)
				out = append(out, wstep{what: what + "committed", next: n, violation: v})
			case errors.Is(err, fence.ErrDuplicate):
				nw.pos = last
				out = append(out, wstep{what: what + "duplicate, skipped", next: n})
			case errors.Is(err, errSpecOverlap):
				nw.pos = s.sPos
				out = append(out, wstep{what: what + "overlap, reload", next: n})
			default: // stale or not claimed: re-run the claim decision
				nw.pc, nw.claimedOK = pcLoad, false
				out = append(out, wstep{what: what + "refused (" + err.Error() + "), re-claim", next: n})
			}
		}
		return out
	}
	return nil
}
