package audit

import (
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/claimant"
	"github.com/batonhq/baton/internal/operator/status"
)

// The Ownership check compares who the sink says holds a partition with who the group says
// owns it. A consumer claims a partition's fence when the group assigns it, before it reads a
// record (consumer/worker.go), with a claimant naming its member in the format of
// internal/claimant: "static:" and the group.instance.id of a static member, the member id of
// any other.

// ownState is what the Ownership check remembers of a partition between passes.
type ownState struct {
	key   string    // what was seen: the claimant and the owner
	since time.Time // the first pass that saw it, in an unbroken run of passes
	pos   int64     // the sink's position then
	pass  int64     // the last pass that saw it
}

// memberIdentity returns the identity a member's claimants carry.
func memberIdentity(m *status.Member) string { return claimant.Identity(m.InstanceID, m.MemberID) }

// judgeOwner is the Ownership check of one fence in a stable group whose member owner owns
// the partition: the fence's claimant belongs to another member, or to none in the group, in
// every pass since a first one more than bound ago (prev is the partition's state of the last
// pass, pass this one's number). It returns the state to keep (nil when the claim is the
// owner's or of no consumer's shape) and whether the claim was compared with the owner.
func judgeOwner(k fence.Key, fr status.Fence, owner *status.Member, members []status.Member, prev *ownState, pass int64, now time.Time, bound time.Duration) (cur *ownState, compared bool, v Violation, bad bool) {
	id, ok := claimant.IdentityOf(fr.Claimant)
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
