package chaos_test

// The minority-coordinator fault on the three-broker cluster: the group coordinator's broker cut
// from the other brokers and from every member but one writer. TestChaosMinorityFenced runs it
// against Baton, TestChaosMinorityBaselines against the unfenced and the lock baselines, and
// TestChaosMinorityMutant against workers built with the fence's conditional advance reverted;
// each counts only the faults proven from both sides of the cut.

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/operator/chaos"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/outbox/pgoutbox"
)

// needMinority skips where the fault cannot run: it needs root, iproute2, network namespaces,
// iptables and cgroup v2 (CI, as root, must have iptables).
func needMinority(t *testing.T) {
	t.Helper()
	needNet(t)
	if why := chaos.MinoritySupported(); why != "" {
		if os.Getenv("CI") != "" && os.Geteuid() == 0 {
			t.Fatal("CI runs as root but " + why)
		}
		t.Skip("skipping the minority-coordinator fault: " + why)
	}
}

// runMinority runs the built-in workload in mode with n minority-coordinator faults, its
// workers built as bin, on the three-broker cluster.
func runMinority(t *testing.T, mode chaos.Mode, n int, bin string) *chaos.Result {
	t.Helper()
	brokers, scriptEnv := cluster(t)
	pool, schema := testenv.Postgres(t)
	url := testenv.PostgresURL(t)
	ctx := testenv.Context(t, 30*time.Minute)
	db := chaos.PgDB(pool)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	store, err := pgfence.New(pool)
	if err == nil {
		err = store.Migrate(ctx)
	}
	if err == nil {
		err = chaos.Migrate(ctx, db)
	}
	if err == nil {
		var box *pgoutbox.Store
		if box, err = pgoutbox.New(pool, store); err == nil {
			err = box.Migrate(ctx)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	var progress bytes.Buffer
	logDir := t.TempDir()
	if d := os.Getenv("BATON_CHAOS_LOGS"); d != "" {
		logDir = d
	}
	cfg := chaos.Config{
		Mode: mode, Workers: 3, Partitions: 6,
		Workload: chaos.Workload{Keys: 60, PerKey: 10}, Rate: 300,
		Faults: []chaos.FaultKind{chaos.FaultNetMinorityCoordinator}, NumFaults: n, Seed: 11,
		Brokers: brokers, KafkaNodes: clusterNodes, ScriptEnv: scriptEnv,
		PostgresURL: url + sep + "search_path=" + schema, RedisAddr: os.Getenv("BATON_REDIS_ADDR"),
		Binary: bin, DeployDir: deployDir(t), Progress: &progress, Settle: 2 * time.Minute, LogDir: logDir,
	}
	t0 := time.Now()
	res, err := chaos.Run(ctx, cfg, db)
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatalf("chaos run: %v", err)
	}
	var verdict bytes.Buffer
	chaos.WriteVerdict(&verdict, res)
	t.Logf("verdict (%.0fs):\n%s", time.Since(t0).Seconds(), verdict.String())
	for _, f := range res.Faults {
		t.Logf("%s on %s (%.0fs), proven %v: %s", f.Kind, f.Target, f.End.Sub(f.Start).Seconds(), f.Bit, f.Detail)
	}
	return res
}

// TestChaosMinorityFenced: Baton's workers under two minority-coordinator faults. At least one
// must be proven from both sides, the zombie writes from the old coordinator's side must all be
// refused, every invariant must hold, and nothing of the cut may be left behind.
func TestChaosMinorityFenced(t *testing.T) {
	needMinority(t)
	t.Cleanup(func() { noNetLeftovers(t) })
	res := runMinority(t, chaos.Fenced, 2, binary(t))
	// A cut whose old coordinator stopped answering before the majority's took over (the
	// broker's own view of its fencing can come first) shows no two coordinators at once: it
	// is reported unproven, and the run counts only with a proven one.
	if proven(res) == 0 {
		t.Fatal("no cut was proven: the fence was never put to the test")
	}
	if len(res.Faults) != 2 {
		t.Errorf("%d faults injected, want 2", len(res.Faults))
	}
	v := res.Verdict
	if !res.OK() {
		t.Errorf("invariants violated: %v (settled %v)", v.Violations(), res.Settled)
	}
	if v.ZombieAttempts == 0 || v.ZombieCommitted != 0 {
		t.Errorf("zombie writes: %d attempted (want some), %d committed (want 0)", v.ZombieAttempts, v.ZombieCommitted)
	}
}

// TestChaosMinorityBaselines proves the checker fails the old coordinator's side's zombie writes
// without the fence: the fault under the unfenced and the lock baselines.
func TestChaosMinorityBaselines(t *testing.T) {
	needMinority(t)
	t.Cleanup(func() { noNetLeftovers(t) })
	bin := binary(t)
	for _, mode := range []chaos.Mode{chaos.Unfenced, chaos.Lock} {
		t.Run(string(mode), func(t *testing.T) {
			if mode == chaos.Lock && os.Getenv("BATON_REDIS_ADDR") == "" {
				if os.Getenv("CI") != "" {
					t.Fatal("BATON_REDIS_ADDR is not set: CI must provide Redis (make test starts it)")
				}
				t.Skip("BATON_REDIS_ADDR is not set: run 'make up' and export what 'make env' prints")
			}
			res := runMinority(t, mode, 2, bin)
			if proven(res) == 0 {
				t.Fatal("no cut was proven: the baseline was never put to the test")
			}
			v := res.Verdict
			if v.ZombieCommitted == 0 || v.OK() {
				t.Errorf("under %s: %d zombie writes committed (want some), verdict OK %v (want false)", mode, v.ZombieCommitted, v.OK())
			}
		})
	}
}

// TestChaosMinorityMutant runs the fault against workers built with PgAdvanceUnconditional (the
// PostgreSQL fence advancing without comparing the tokens): the checker must fail the run on a
// proven cut.
func TestChaosMinorityMutant(t *testing.T) {
	needMinority(t)
	t.Cleanup(func() { noNetLeftovers(t) })
	res := runMinority(t, chaos.Fenced, 2, mutantBinary(t, "PgAdvanceUnconditional"))
	if proven(res) == 0 {
		t.Fatal("no cut was proven: the mutant was never put to the test")
	}
	if res.Verdict.OK() {
		t.Errorf("the checker passed PgAdvanceUnconditional under %s", chaos.FaultNetMinorityCoordinator)
	}
}
