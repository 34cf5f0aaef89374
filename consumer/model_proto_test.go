package consumer

import (
	"errors"
	"fmt"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/fencestore"
)

// The worker side of the model: what one partition worker does in one atomic step. Each
// sink step calls the real fencestore rule on the model's sink state; each decision calls
// the consumer's real claim decision.

var modelKey = fence.Key{Group: "g", Topic: "t", Partition: 0}

type protocol struct {
	name string
	step func(s mstate, i int, canFault bool) []wstep
	// relayReclaims: a Flush refused because the fence moved re-runs the claim decision
	// (otherwise the relay retries it until the next record's write notices).
	relayReclaims bool
}

type wstep struct {
	what      string
	next      mstate
	replyLost bool
	violation string
}

func realProtocol() protocol { return specProtocol() }

// legacyProtocol is the claim path as it was before issue 10 (Load, compare locally, Claim;
// Heartbeat proof; Recover conflict retried; verify at the assignment epoch only), over the
// sink rules as they were (Claim accepts an equal token; Advance checks only the last
// offset). It exists to show that the model finds findings 1-4.
func legacyProtocol() protocol {
	return protocol{name: "legacy", step: legacyStep}
}

func legacyStep(s mstate, i int, canFault bool) []wstep {
	w := s.w[i]
	var out []wstep
	n := s
	nw := &n.w[i]
	switch w.pc {
	case pcLoad:
		st := s.sinkState()
		tok := tok8{era: tok8of(st.Token).era, epoch: w.epoch}
		if s.sTok == tok && tok != w.ours {
			nw.seen = s.sTok
			nw.pc = pcVerify
			return append(out, wstep{what: fmt.Sprintf("load %s: equal token not ours, suspect", s.sTok), next: n})
		}
		nw.ours, nw.tok, nw.pc = tok, tok, pcClaim
		return append(out, wstep{what: fmt.Sprintf("load %s, will claim %s", s.sTok, tok), next: n})
	case pcClaim:
		err := fencestore.CheckClaim(modelKey, s.sinkState(), w.tok.token())
		var se *fence.StaleError
		switch {
		case err == nil:
			nw.pos, nw.pc = s.sPos, pcRun
			v := n.took(i, w.tok, false)
			return append(out, wstep{what: fmt.Sprintf("claim %s ok, position %d", w.tok, s.sPos), next: n, violation: v})
		case errors.As(err, &se):
			nw.seen, nw.pc = s.sTok, pcVerify
			return append(out, wstep{what: fmt.Sprintf("claim %s stale (stored %s)", w.tok, s.sTok), next: n})
		}
		return append(out, wstep{what: "claim: " + err.Error(), next: n, violation: "claim refused: " + err.Error()})
	case pcVerify:
		// The Heartbeat proof: a loading coordinator answers NONE blindly.
		cur := s.loading || (w.member != 0 && s.member[i] == w.member && s.gen == w.epoch)
		if cur {
			nw.pc = pcRecover
			return append(out, wstep{what: fmt.Sprintf("heartbeat(m%d, gen %d): current", w.member, w.epoch), next: n})
		}
		nw.pc = pcStopped
		return append(out, wstep{what: fmt.Sprintf("heartbeat(m%d, gen %d): not current, stop", w.member, w.epoch), next: n})
	case pcRecover:
		if s.sTok != w.seen {
			// ErrConflict, retried as transient with the same expected token: no change.
			return out
		}
		to := tok8{era: w.seen.era + 1, epoch: w.epoch}
		v := n.took(i, to, true)
		if canFault { // the recovery commits but its reply is lost: retried as is
			lost := n
			out = append(out, wstep{what: fmt.Sprintf("recover %s -> %s", w.seen, to), next: lost, replyLost: true, violation: v})
		}
		nw.ours, nw.pc = to, pcLoad
		return append(out, wstep{what: fmt.Sprintf("recover %s -> %s", w.seen, to), next: n, violation: v})
	case pcRun:
		for last := w.pos + 1; last < logLen; last++ {
			n := s
			nw := &n.w[i]
			first := w.pos + 1
			err := fencestore.CheckAdvance(modelKey, s.sinkState(), w.tok.token(), int64(last))
			switch {
			case err == nil:
				v := n.commit(i, first, last)
				out = append(out, wstep{what: fmt.Sprintf("apply %d..%d under %s: committed", first, last, w.tok), next: n, violation: v})
			case errors.Is(err, fence.ErrDuplicate):
				nw.pos = last
				out = append(out, wstep{what: fmt.Sprintf("apply %d..%d under %s: duplicate, skipped", first, last, w.tok), next: n})
			case errors.Is(err, fence.ErrStale):
				nw.pc = pcStopped
				out = append(out, wstep{what: fmt.Sprintf("apply %d..%d under %s: stale, stop", first, last, w.tok), next: n})
			default:
				out = append(out, wstep{what: "apply: " + err.Error(), next: n, violation: "apply refused: " + err.Error()})
			}
		}
	}
	return out
}
