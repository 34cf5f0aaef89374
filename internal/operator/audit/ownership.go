package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/operator/status"
)

// The Ownership check compares who the sink says holds a partition with who the group says
// owns it. A consumer claims a partition's fence when the group assigns it, before it reads a
// record (consumer/worker.go), with a claimant naming its member (consumer/claimant.go):
//
//	<identity>/<16 hex digits>[/<member id>]
//
// where the identity is "static:" and the group.instance.id of a static member, the member id
// of any other, escaped to [A-Za-z0-9._-] and %XX ("~" and a SHA-256 prefix when too long). The
// format is the consumer's; TestOwnershipCleanRun checks this copy against a running consumer.

// ownState is what the Ownership check remembers of a partition between passes.
type ownState struct {
	key   string    // what was seen: the claimant and the owner
	since time.Time // the first pass that saw it, in an unbroken run of passes
	pos   int64     // the sink's position then
	pass  int64     // the last pass that saw it
}

// claimantIdentity returns the identity a consumer's claimant names, and false for a claimant
// of another shape (an operator's, a row never claimed).
func claimantIdentity(c string) (string, bool) {
	const randomHex = 16
	i := strings.IndexByte(c, '/')
	if i <= 0 {
		return "", false
	}
	rest := c[i+1:]
	if len(rest) < randomHex || (len(rest) > randomHex && rest[randomHex] != '/') {
		return "", false
	}
	for j := range randomHex {
		if h := rest[j]; !('0' <= h && h <= '9' || 'a' <= h && h <= 'f') {
			return "", false
		}
	}
	return c[:i], true
}

// memberIdentity returns the identity a member's claimants carry.
func memberIdentity(m *status.Member) string {
	if m.InstanceID != "" {
		return "static:" + escapedIdentity(m.InstanceID)
	}
	return escapedIdentity(m.MemberID)
}

// escapedIdentity escapes s as a claimant's identity: [A-Za-z0-9._-] kept, every other byte
// %XX, and more than 512 escaped bytes replaced by "~" and 32 hex digits of s's SHA-256.
func escapedIdentity(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	if b.Len() <= 512 {
		return b.String()
	}
	h := sha256.Sum256([]byte(s))
	return "~" + hex.EncodeToString(h[:16])
}

// judgeOwner is the Ownership check of one fence in a stable group whose member owner owns
// the partition: the fence's claimant belongs to another member, or to none in the group, in
// every pass since a first one more than bound ago (prev is the partition's state of the last
// pass, pass this one's number). It returns the state to keep (nil when the claim is the
// owner's or of no consumer's shape) and whether the claim was compared with the owner.
func judgeOwner(k fence.Key, fr status.Fence, owner *status.Member, members []status.Member, prev *ownState, pass int64, now time.Time, bound time.Duration) (cur *ownState, compared bool, v Violation, bad bool) {
	id, ok := claimantIdentity(fr.Claimant)
	if !ok {
		return nil, false, Violation{}, false
	}
	if id == memberIdentity(owner) {
		return nil, true, Violation{}, false
	}
	cur = &ownState{key: fr.Claimant + "\x00" + owner.MemberID, since: now, pos: fr.Position, pass: pass}
	if prev != nil && prev.key == cur.key && prev.pass == pass-1 {
		cur.since, cur.pos = prev.since, prev.pos
	}
	if now.Sub(cur.since) <= bound {
		return cur, true, Violation{}, false
	}
	inGroup := false
	for i := range members {
		inGroup = inGroup || memberIdentity(&members[i]) == id
	}
	return cur, true, violation(Ownership, k, now, fr.Claimant, "fence held by a claimant that is not the partition's owner",
		f("claimant", fr.Claimant), f("claimant_in_group", inGroup), f("owner", owner.String()), f("owner_member_id", owner.MemberID),
		f("position", fr.Position), f("position_then", cur.pos), f("since", cur.since.UTC()), f("bound", bound.String())), true
}

// judgeUnclaimed is the Ownership check of a partition with no fence row: Kafka's committed
// offset moved between two passes (from prev to cur). A consumer claims the fence before it
// applies, and commits after it applied, and the fence rows are read after the offsets: a
// commit with no fence row is a member that writes without the fence.
func judgeUnclaimed(k fence.Key, prev, cur int64, owner *status.Member, now time.Time) (Violation, bool) {
	if cur == prev {
		return Violation{}, false
	}
	return violation(Ownership, k, now, owner.String(), "committed offset moved on a partition no fence claims",
		f("committed_before", prev), f("committed", cur), f("owner", owner.String())), true
}
