package pglease

import (
	"strings"
	"testing"
)

// Two grants whose sessions had the same backend pid (the old primary's and a promoted
// replica's, or a server restored from a backup: pids restart and repeat exactly when the
// counter goes back and re-issues a token) must be two claimants. Interleaving that broke the
// rule: holder A, pid 4242, token 17 on the old primary; a restore; holder B, pid 4242, the
// re-issued token 17; with the pid as the claimant, B's claim of 17 is A's idempotent re-claim,
// and both hold the token. (Mutant GrantIDIsThePid.)
func TestGrantIDUniqueForOnePid(t *testing.T) {
	a, b := grantID(4242), grantID(4242)
	if a == b {
		t.Fatalf("two grants of pid 4242 have the one identity %q: after a restore, two holders of one token would be the same claimant", a)
	}
	for _, id := range []string{a, b} {
		if !strings.HasPrefix(id, "4242/") {
			t.Errorf("grant identity %q does not start with its backend pid", id)
		}
	}
}
