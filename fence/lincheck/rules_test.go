package lincheck

import (
	"errors"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/fencestore"
)

// The fence rules of the model: fencestore's, called, not copied. (Before issue 10's
// contract: no claimant, Advance by last position only.)

var (
	errOverlap    = errors.New("lincheck: no overlap sentinel yet")
	errNotClaimed = errors.New("lincheck: no not-claimed sentinel yet")
)

func checkClaim(k fence.Key, s mstate, t fence.Token, claimant string) error {
	return fencestore.CheckClaim(k, s, t)
}

func checkAdvance(k fence.Key, s mstate, t fence.Token, first, last int64) error {
	return fencestore.CheckAdvance(k, s, t, last)
}

func claimed(s mstate, t fence.Token, claimant string) mstate {
	s.Token = t
	return s
}

func recovered(s mstate, claimant string) mstate { return s }

func claimantSuffix(s mstate) string { return "" }
