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
