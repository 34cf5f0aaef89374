package chaos_test

import (
	"os"
	"testing"

	"github.com/batonhq/baton/internal/operator/chaos"
)

// needNet skips a test of the network faults where they cannot run: they need root, iproute2
// and network namespaces (CI runs as root).
func needNet(t *testing.T) {
	t.Helper()
	if why := chaos.NetSupported(); why != "" {
		t.Skip("skipping the network faults: " + why)
	}
}

// noNetLeftovers asserts that the runs of this process removed every namespace, veth, bridge
// and qdisc they created.
func noNetLeftovers(t *testing.T) {
	t.Helper()
	if left := chaos.NetLeftovers(); len(left) > 0 {
		t.Errorf("network left behind after the run: %v", left)
	}
}

// TestChaosNetFenced is the network faults' sample run: Baton's workers, each in a network
// namespace of its own, each network kind once. The fence must refuse the zombie writes of the
// cut-off members, every fault must be proven from both sides of its link, the invariants must
// hold, and nothing of the run's network may be left behind.
func TestChaosNetFenced(t *testing.T) {
	needNet(t)
	t.Cleanup(func() { noNetLeftovers(t) })
	res, _ := run(t, chaos.Fenced, chaos.NetFaults, soak(t, len(chaos.NetFaults)))
	v := res.Verdict
	if !res.OK() {
		t.Errorf("invariants violated: %v (settled %v)", v.Violations(), res.Settled)
	}
	kinds := map[chaos.FaultKind]int{}
	for _, f := range res.Faults {
		kinds[f.Kind]++
		if !f.Bit {
			t.Errorf("fault %s on %s was not proven: %s", f.Kind, f.Target, f.Detail)
		}
	}
	for _, k := range chaos.NetFaults {
		if kinds[k] == 0 {
			t.Errorf("no %s fault injected", k)
		}
	}
	if v.ZombieAttempts == 0 || v.ZombieCommitted != 0 {
		t.Errorf("zombie writes: %d attempted (want some), %d committed (want 0)", v.ZombieAttempts, v.ZombieCommitted)
	}
}

// TestChaosNetBaselines proves the checker fails a cut-off zombie's writes without the fence:
// net-broker-cut under the unfenced and the lock baselines.
func TestChaosNetBaselines(t *testing.T) {
	needNet(t)
	t.Cleanup(func() { noNetLeftovers(t) })
	for _, mode := range []chaos.Mode{chaos.Unfenced, chaos.Lock} {
		t.Run(string(mode), func(t *testing.T) {
			if mode == chaos.Lock && os.Getenv("BATON_REDIS_ADDR") == "" {
				t.Skip("BATON_REDIS_ADDR is not set: run 'make up' and export what 'make env' prints")
			}
			res, _ := run(t, mode, []chaos.FaultKind{chaos.FaultNetBrokerCut}, 2)
			v := res.Verdict
			bit := 0
			for _, f := range res.Faults {
				if f.Bit {
					bit++
				}
			}
			if bit == 0 {
				t.Fatal("no cut led to a takeover: the baseline was never put to the test")
			}
			if v.ZombieCommitted == 0 || v.OK() {
				t.Errorf("under %s: %d zombie writes committed (want some), verdict OK %v (want false)", mode, v.ZombieCommitted, v.OK())
			}
		})
	}
}
