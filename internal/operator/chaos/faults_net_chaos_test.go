package chaos_test

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/operator/chaos"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// needNet skips a test of the network faults where they cannot run: they need root, iproute2
// and network namespaces (CI, as root, must have iproute2).
func needNet(t *testing.T) {
	t.Helper()
	if why := chaos.NetSupported(); why != "" {
		if os.Getenv("CI") != "" && os.Geteuid() == 0 && strings.Contains(why, "iproute2") {
			t.Fatal("CI runs as root but " + why + ": install iproute2")
		}
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
			res, _ := run(t, mode, []chaos.FaultKind{chaos.FaultNetBrokerCut}, 1)
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

// TestChaosNetMutant runs the network kinds that make a zombie (net-broker-cut,
// net-heal-mid-tx) in workers built with a mutant (internal/testkit/mutants) reintroducing a
// bug, named by BATON_CHAOS_NET_MUTANT: the checker must fail the run. It builds a patched copy
// of the module, so it runs on demand only.
func TestChaosNetMutant(t *testing.T) {
	needNet(t)
	name := os.Getenv("BATON_CHAOS_NET_MUTANT")
	if name == "" {
		t.Skip("set BATON_CHAOS_NET_MUTANT to a mutant's name to run the network faults against it")
	}
	t.Cleanup(func() { noNetLeftovers(t) })
	brokers := testenv.KafkaBrokers(t)
	pool, schema := testenv.Postgres(t)
	url := testenv.PostgresURL(t)
	ctx := testenv.Context(t, 10*time.Minute)
	db := chaos.PgDB(pool)
	store, err := pgfence.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := chaos.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	var progress bytes.Buffer
	cfg := chaos.Config{
		Mode: chaos.Fenced, Workers: 3, Partitions: 6, LogDir: t.TempDir(),
		Workload: chaos.Workload{Keys: 60, PerKey: 20}, Rate: 600,
		Faults: []chaos.FaultKind{chaos.FaultNetBrokerCut, chaos.FaultNetHealMidTx}, NumFaults: 4, Seed: 7,
		Brokers: brokers, PostgresURL: url + sep + "search_path=" + schema,
		Binary: mutantBinary(t, name), Progress: &progress, Settle: time.Minute,
	}
	if d := os.Getenv("BATON_CHAOS_LOGS"); d != "" {
		cfg.LogDir = d
	}
	res, err := chaos.Run(ctx, cfg, db)
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatalf("chaos run: %v", err)
	}
	var verdict bytes.Buffer
	chaos.WriteVerdict(&verdict, res)
	t.Logf("verdict:\n%s", verdict.String())
	if res.OK() {
		t.Errorf("the checker passed %s under the network faults", name)
	}
}
