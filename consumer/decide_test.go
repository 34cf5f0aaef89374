package consumer

import (
	"testing"

	"github.com/batonhq/baton/fence"
)

// The claim decision's handling of a refusal at our own token and of a token higher only by
// its era, step by step, with RecoverRegressions(false) (the model check explores the same
// function over every interleaving; this pins the individual steps).
func TestDecideHandover(t *testing.T) {
	const me = "static:inst-a"
	ours := fence.Token{Era: 0, Epoch: 7}
	mine := me + "/0123456789abcdef/inst-a-old"
	type want struct {
		op       claimOp
		handover bool
		why      giveUp
	}
	run := func(t *testing.T, s claimState, ins []claimInput, w []want) {
		t.Helper()
		for i, in := range ins {
			var step claimStep
			s, step = decideClaim(s, in)
			if step.Op != w[i].op || step.Handover != w[i].handover || step.Why != w[i].why {
				t.Fatalf("step %d: %+v, want %+v", i, step, w[i])
			}
		}
	}
	start := claimState{Epoch: 7, Identity: me}
	refusedEqual := claimInput{Event: evClaimStale, Stored: ours, Presented: ours}
	t.Run("our identity: a handover, recovered without RecoverRegressions", func(t *testing.T) {
		run(t, start, []claimInput{refusedEqual, {Event: evLoaded, State: fence.State{Token: ours, Claimant: mine}}, {Event: evCurrent}},
			[]want{{op: opLoad}, {op: opVerify}, {op: opRecover, handover: true}})
	})
	t.Run("another identity: a regression", func(t *testing.T) {
		other := "static:inst-b/0123456789abcdef"
		run(t, start, []claimInput{refusedEqual, {Event: evLoaded, State: fence.State{Token: ours, Claimant: other}}, {Event: evCurrent}},
			[]want{{op: opLoad}, {op: opVerify}, {op: opGiveUp, why: giveUpNoRecovery}})
	})
	t.Run("a handover still needs the proof", func(t *testing.T) {
		run(t, start, []claimInput{refusedEqual, {Event: evLoaded, State: fence.State{Token: ours, Claimant: mine}}, {Event: evNotCurrent}},
			[]want{{op: opLoad}, {op: opVerify}, {op: opGiveUp, why: giveUpNotCurrent}})
	})
	t.Run("the fence moved before the identifying load: prove, then claim afresh", func(t *testing.T) {
		moved := fence.State{Token: fence.Token{Era: 1, Epoch: 7}, Claimant: mine}
		run(t, start, []claimInput{refusedEqual, {Event: evLoaded, State: moved}, {Event: evCurrent}},
			[]want{{op: opLoad}, {op: opVerify}, {op: opLoad}})
	})
	t.Run("higher only by its era: claim again, no recovery", func(t *testing.T) {
		for _, stored := range []fence.Token{{Era: 1, Epoch: 3}, {Era: 1, Epoch: 7}} {
			run(t, start, []claimInput{{Event: evClaimStale, Stored: stored, Presented: ours}, {Event: evCurrent}},
				[]want{{op: opVerify}, {op: opLoad}})
		}
	})
	t.Run("a later epoch stored: a regression", func(t *testing.T) {
		run(t, start, []claimInput{{Event: evClaimStale, Stored: fence.Token{Era: 0, Epoch: 9}, Presented: ours}, {Event: evCurrent}},
			[]want{{op: opVerify}, {op: opGiveUp, why: giveUpNoRecovery}})
	})
}

// A claim presents the assignment's epoch at the stored era, whatever epoch is stored: a token
// derived from the stored one (its epoch + 1, say) would let any member, a zombie included,
// climb above the current owner's.
func TestDecideClaimsAtTheAssignmentEpoch(t *testing.T) {
	for _, stored := range []fence.Token{{Era: 0, Epoch: 0}, {Era: 2, Epoch: 3}, {Era: 2, Epoch: 9}} {
		s, step := decideClaim(claimState{Epoch: 5}, claimInput{Event: evStart})
		if step.Op != opLoad {
			t.Fatalf("start: %+v, want a load", step)
		}
		_, step = decideClaim(s, claimInput{Event: evLoaded, State: fence.State{Token: stored, Claimant: "other"}})
		if want := (fence.Token{Era: stored.Era, Epoch: 5}); step.Op != opClaim || step.Token != want {
			t.Errorf("with %s stored, the worker of epoch 5 claims token %s (op %d), want the stored era at the assignment's epoch, %s", stored, step.Token, step.Op, want)
		}
	}
}

// Recover losing its compare-and-set reloads and decides again, but not for ever: the
// (maxConflicts+1)th conflict in a row gives the partition up.
func TestDecideGivesUpAfterRecoverConflicts(t *testing.T) {
	s := claimState{Epoch: 5, Recover: true}
	for i := 1; i <= maxConflicts+1; i++ {
		var step claimStep
		s, step = decideClaim(s, claimInput{Event: evConflict})
		if i <= maxConflicts {
			if step.Op != opLoad {
				t.Fatalf("conflict %d: %+v, want a reload", i, step)
			}
			continue
		}
		if step.Op != opGiveUp || step.Why != giveUpConflicts {
			t.Fatalf("%d Recover conflicts in a row did not give the partition up (counted %d): %+v, want giveUpConflicts", i, s.Conflicts, step)
		}
	}
}

// The Load that confirms a claim before the first write must find the very token claimed:
// another era at the same epoch, held by another claimant (an operator's reset, a recovery
// between the claim and the Load), is a fence that moved, which only the coordinator's proof
// and a fresh claim get past; the worker must not proceed on its old claim.
func TestDecideConfirmingLoadComparesTheWholeToken(t *testing.T) {
	ours := fence.Token{Era: 1, Epoch: 5}
	s, step := decideClaim(claimState{Epoch: 5}, claimInput{Event: evClaimed, State: fence.State{Token: ours, Claimant: "mine"}})
	if step.Op != opTopic {
		t.Fatalf("claimed: %+v, want the topic comparison", step)
	}
	if s, step = decideClaim(s, claimInput{Event: evTopicSame}); step.Op != opLoad {
		t.Fatalf("topic same: %+v, want the confirming load", step)
	}
	moved := fence.State{Token: fence.Token{Era: 2, Epoch: 5}, Claimant: "another"}
	if s, step = decideClaim(s, claimInput{Event: evLoaded, State: moved}); step.Op != opVerify {
		t.Fatalf("confirming load: %+v, want the proof", step)
	}
	if _, step = decideClaim(s, claimInput{Event: evCurrent}); step.Op != opLoad {
		t.Fatalf("the confirming Load found %s held by %s after claiming %s, and the worker went on with op %d: want a fresh load and claim (op %d)",
			moved.Token, moved.Claimant, ours, step.Op, opLoad)
	}
}
