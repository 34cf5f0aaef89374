package lincheck

import (
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/fencecheck"
)

// The fence rules of the sequential model: fencecheck's, called, not copied.

var (
	errOverlap    = fence.ErrOverlap
	errNotClaimed = fence.ErrNotClaimed
)

func checkClaim(k fence.Key, s mstate, t fence.Token, claimant string) error {
	return fencecheck.CheckClaim(k, s, t, claimant)
}

func checkAdvance(k fence.Key, s mstate, t fence.Token, first, last int64) error {
	return fencecheck.CheckAdvance(k, s, t, first, last)
}

// claimed is the state after an accepted Claim: t held by claimant, the position kept.
func claimed(s mstate, t fence.Token, claimant string) mstate {
	s.Token, s.Claimant = t, claimant
	return s
}

// recovered is the state after an accepted Recover: the new token held by claimant.
func recovered(s mstate, claimant string) mstate {
	s.Claimant = claimant
	return s
}

func claimantSuffix(s mstate) string {
	if s.Claimant == "" {
		return ""
	}
	return " " + s.Claimant
}
