package chaos_test

// The topic faults on the real broker: the source topic recreated and grown mid-run, the
// harness playing the operator (pause the producer, drain, change the topic, prove every
// partition held, baton topics reset / ack, resume). They run on BATON_KAFKA_BROKERS (no
// broker is restarted; only the run's own topic is deleted).

import (
	"os"
	"strings"
	"testing"

	"github.com/batonhq/baton/internal/operator/chaos"
)

// TestChaosTopicFaults runs each topic fault once against Baton: each must be proven (the
// topic changed, every partition held with records waiting and nothing applied, released by
// the operator's command, then applied), and every invariant must hold across the change.
//
// In CI (about 70 s of faults and settling, 120 s and more on a loaded machine): the topic
// faults run where the coordinator faults run.
func TestChaosTopicFaults(t *testing.T) {
	res := runFaults(t, chaos.TopicFaults, 1, binary(t), true, false)
	for _, f := range res.Faults {
		if !f.Bit {
			t.Errorf("fault %s on %s not proven: %s", f.Kind, f.Target, f.Detail)
		}
	}
	if len(res.Faults) != len(chaos.TopicFaults) {
		t.Errorf("%d faults injected, want %d", len(res.Faults), len(chaos.TopicFaults))
	}
	if !res.OK() {
		t.Errorf("invariants violated: %v (settled %v)", res.Verdict.Violations(), res.Settled)
	}
}

// TestChaosTopicMutants runs each topic fault against workers built with the protection it
// targets removed (a mutant of internal/testkit/mutants, patched into a scratch copy of the
// module) and requires the checker to report the violation. With BATON_CHAOS_MUTANTS=1 (or a
// mutant's or a fault's name).
func TestChaosTopicMutants(t *testing.T) {
	only := os.Getenv("BATON_CHAOS_MUTANTS")
	if only == "" {
		t.Skip("set BATON_CHAOS_MUTANTS=1 to run the chaos mutants (a run each)")
	}
	cases := []struct {
		mutant string // a mutant of internal/testkit/mutants
		fault  chaos.FaultKind
	}{
		{"TopicIdentityUnchecked", chaos.FaultTopicRecreate},
		{"GrownPartitionNotHeld", chaos.FaultTopicGrow},
	}
	for _, c := range cases {
		if only != "1" && !strings.Contains(c.mutant, only) && string(c.fault) != only {
			continue
		}
		t.Run(c.mutant+"/"+string(c.fault), func(t *testing.T) {
			res := runFaults(t, []chaos.FaultKind{c.fault}, 1, mutantBinary(t, c.mutant), true, false)
			if res.Verdict.OK() {
				t.Errorf("the checker found nothing wrong with %s under %s: %+v", c.mutant, c.fault, res.Faults)
			} else {
				t.Logf("caught %s: %v", c.mutant, res.Verdict.Violations())
			}
		})
	}
}
