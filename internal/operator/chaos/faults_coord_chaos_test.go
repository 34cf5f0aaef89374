package chaos_test

// The coordinator and identity faults on the real broker: a paused member across a broker restart (the group
// coordinator loading), the coordinator's broker killed in a three-broker cluster, static
// members replaced without a rebalance, and a receiver reading two destination topics with one
// inbox. TestChaosCoordFaults runs each once against Baton and requires every invariant to
// hold; TestChaosCoordMutants runs each against workers built with the protection it targets
// removed (a mutant of internal/testkit/mutants, patched into a scratch copy of the module) and
// requires the checker to report the violation.

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/operator/chaos"
	"github.com/batonhq/baton/internal/testkit/mutants"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/outbox/pgoutbox"
)

// The three-broker cluster the tests of this file share: started by the first test that needs
// it (deploy/local/kafka.sh with KAFKA_NODES=3, in a temporary state directory, on
// BATON_CHAOS_CLUSTER_PORT.. or 29092..29097) and stopped by TestMain; or, with
// BATON_CHAOS_CLUSTER_DIR, one already running in that state directory, left running.
var (
	clusterMu   sync.Mutex
	clusterEnv  []string // KAFKA_NODES, BATON_STATE_DIR, KAFKA_CLUSTER_PORT for kafka.sh
	clusterAddr []string
	clusterErr  error
	clusterDir  string
)

const clusterNodes = 3

func deployDir(t *testing.T) string {
	d, err := filepath.Abs("../../../deploy/local")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// cluster returns the shared cluster's brokers and kafka.sh's environment for it, starting it
// if needed. It skips (fails in CI) without a real broker environment.
func cluster(t *testing.T) ([]string, []string) {
	t.Helper()
	testenv.KafkaBrokers(t) // skips cleanly where no real broker is set up
	clusterMu.Lock()
	defer clusterMu.Unlock()
	if clusterAddr == nil && clusterErr == nil {
		port := os.Getenv("BATON_CHAOS_CLUSTER_PORT")
		if port == "" {
			port = "29092"
		}
		// BATON_CHAOS_CLUSTER_DIR names the state directory of a cluster started by hand
		// (kept running afterwards); otherwise the cluster is the tests' own.
		dir := os.Getenv("BATON_CHAOS_CLUSTER_DIR")
		if dir == "" {
			var err error
			if dir, err = os.MkdirTemp("", "baton-chaos-cluster-"); err != nil {
				t.Fatal(err)
			}
			clusterDir = dir
		}
		// BATON_SECURE cleared: the cluster is plaintext (kafka.sh: secure mode is single-node only),
		// whatever the rest of the run (.ci/run exports BATON_SECURE=1 for the secure tests).
		clusterEnv = []string{fmt.Sprintf("KAFKA_NODES=%d", clusterNodes), "BATON_STATE_DIR=" + dir, "KAFKA_CLUSTER_PORT=" + port, "BATON_SECURE="}
		t0 := time.Now()
		out, err := kafkaSh(deployDir(t), "start")
		if err != nil {
			clusterErr = fmt.Errorf("kafka.sh start (KAFKA_NODES=%d): %v\n%s", clusterNodes, err, out)
		} else {
			env, err := kafkaSh(deployDir(t), "env")
			if err != nil {
				clusterErr = fmt.Errorf("kafka.sh env: %v", err)
			} else {
				s := strings.TrimSpace(env)
				s = strings.TrimPrefix(s, "export BATON_KAFKA_BROKERS='")
				clusterAddr = strings.Split(strings.TrimSuffix(s, "'"), ",")
			}
			t.Logf("three-broker cluster %v up in %.1fs", clusterAddr, time.Since(t0).Seconds())
		}
	}
	if clusterErr != nil {
		t.Fatal(clusterErr)
	}
	return clusterAddr, clusterEnv
}

func kafkaSh(deploy string, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(deploy, "kafka.sh"), args...)
	cmd.Env = append(os.Environ(), clusterEnv...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if args[0] == "env" {
		cmd.Stderr = nil
	}
	err := cmd.Run()
	return out.String(), err
}

// stopCluster stops the shared cluster if a test started it (TestMain).
func stopCluster() {
	clusterMu.Lock()
	defer clusterMu.Unlock()
	if clusterDir == "" {
		return
	}
	if d, err := filepath.Abs("../../../deploy/local"); err == nil {
		_, _ = kafkaSh(d, "stop")
	}
	_ = os.RemoveAll(clusterDir)
	clusterDir = ""
}

// mutantBinary builds cmd/baton from a scratch copy of the module with the named mutant's
// patch applied (internal/testkit/mutants).
func mutantBinary(t *testing.T, name string) string {
	t.Helper()
	root, err := mutants.ModuleRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "baton-"+name)
	if err := mutants.BuildBaton(t.Context(), root, name, bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

// runFaults runs the built-in workload, fenced, with the given faults, each n times, in workers
// built as bin: on the three-broker cluster, or with single on BATON_KAFKA_BROKERS,
// which kafka.sh restarts as the environment says (BATON_STATE_DIR, KAFKA_PORT: never a
// shared broker).
// strict: the coordinator-loading faults must show the zombie asking the loading coordinator
// (Config.ProveAsk), with a coordinator log long enough to load for seconds (the blind-proof
// mutant runs); CI's TestChaosCoordFaults counts the load with the zombie resumed inside it.
func runFaults(t *testing.T, faults []chaos.FaultKind, n int, bin string, single, strict bool) *chaos.Result {
	t.Helper()
	var brokers, scriptEnv []string
	nodes := clusterNodes
	if single {
		brokers, nodes = testenv.KafkaBrokers(t), 1
	} else {
		brokers, scriptEnv = cluster(t)
	}
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
		logDir = d // kept after the run, to read a failure's worker logs
	}
	filler := 8000
	if strict {
		filler = 200000
	}
	cfg := chaos.Config{
		Mode: chaos.Fenced, Workers: 3, Partitions: 6,
		Workload: chaos.Workload{Keys: 60, PerKey: 10, CommandEvery: 2}, Rate: 300,
		Faults: faults, NumFaults: n * len(faults), Seed: 10,
		Brokers: brokers, KafkaNodes: nodes, ScriptEnv: scriptEnv,
		PostgresURL: url + sep + "search_path=" + schema,
		Binary:      bin, DeployDir: deployDir(t), LoadFiller: filler, ProveAsk: strict,
		Progress: &progress, Settle: 2 * time.Minute, LogDir: logDir,
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
	return res
}

// TestChaosCoordFaults runs each coordinator and identity fault once on the three-broker cluster against
// Baton: each must be proven to have happened, and every invariant must hold.
func TestChaosCoordFaults(t *testing.T) {
	res := runFaults(t, chaos.CoordFaults, 1, binary(t), false, false)
	for _, f := range res.Faults {
		if !f.Bit {
			t.Errorf("fault %s on %s not proven: %s", f.Kind, f.Target, f.Detail)
		}
	}
	if len(res.Faults) != len(chaos.CoordFaults) {
		t.Errorf("%d faults injected, want %d", len(res.Faults), len(chaos.CoordFaults))
	}
	if !res.OK() {
		t.Errorf("invariants violated: %v (settled %v)", res.Verdict.Violations(), res.Settled)
	}
	if res.Verdict.ZombieAttempts == 0 {
		t.Errorf("no zombie write attempted: the frozen workers' held writes never reached the fence")
	}
	if res.Verdict.CommandsInverted == 0 {
		t.Errorf("the receiver never read a key out of order across its two topics: the inbox scope was not put to the test")
	}
}

// TestChaosCoordMutants runs each fault against workers built with the fix it targets
// reverted, and requires the checker to report the violation. Slow (a run per mutant): it runs
// with BATON_CHAOS_MUTANTS=1 (or a mutant's or a fault's name, to run those cases only). The
// faults that do not need the cluster run on BATON_KAFKA_BROKERS, restarted through kafka.sh
// with the test's environment: point it at a private broker (BATON_STATE_DIR, KAFKA_PORT).
func TestChaosCoordMutants(t *testing.T) {
	if os.Getenv("BATON_CHAOS_MUTANTS") == "" {
		t.Skip("set BATON_CHAOS_MUTANTS=1 to run the chaos mutants (a run each on the three-broker cluster)")
	}
	cases := []struct {
		mutant string // a mutant of internal/testkit/mutants
		fault  chaos.FaultKind
		n      int
		// control: the same fault also runs on cmd/baton as it is, where the interleaving
		// must be proven again and every invariant hold.
		control bool
	}{
		{"EqualTokenOtherClaimantAccepted", chaos.FaultStaticReplace, 2, false},
		{"InboxScopeIgnoresDestination", chaos.FaultTwoTopicInbox, 1, false},
		{"BlindHeartbeatProof", chaos.FaultPausedBrokerRestart, 2, true},
		{"BlindHeartbeatProof", chaos.FaultCoordinatorKill, 2, true},
	}
	if only := os.Getenv("BATON_CHAOS_MUTANTS"); only != "1" {
		var keep = cases[:0]
		for _, c := range cases {
			if strings.Contains(c.mutant, only) || string(c.fault) == only {
				keep = append(keep, c)
			}
		}
		cases = keep
	}
	bins := map[string]string{} // built once per mutant, and "" for cmd/baton as it is
	build := func(name string) string {
		if bins[name] == "" {
			if name == "" {
				bins[name] = binary(t)
			} else {
				bins[name] = mutantBinary(t, name)
			}
		}
		return bins[name]
	}
	for _, c := range cases {
		single := c.fault != chaos.FaultCoordinatorKill
		t.Run(c.mutant+"/"+string(c.fault), func(t *testing.T) {
			t0 := time.Now()
			res := runFaults(t, []chaos.FaultKind{c.fault}, c.n, build(c.mutant), single, c.control)
			bit := proven(res)
			if res.Verdict.OK() {
				t.Errorf("the checker found nothing wrong with %s under %s (%d of %d faults proven)", c.mutant, c.fault, bit, len(res.Faults))
			} else {
				t.Logf("caught %s: %v (%d of %d faults proven; %.0fs)", c.mutant, res.Verdict.Violations(), bit, len(res.Faults), time.Since(t0).Seconds())
			}
			if c.control && bit == 0 {
				// The blind answer needs the interleaving: without it a catch is not this fault's.
				t.Errorf("%s: the interleaving was never seen (a zombie asking a loading coordinator for its proof)", c.fault)
			}
		})
		if !c.control {
			continue
		}
		t.Run("control/"+string(c.fault), func(t *testing.T) {
			t0 := time.Now()
			res := runFaults(t, []chaos.FaultKind{c.fault}, c.n, build(""), single, true)
			bit := proven(res)
			if bit == 0 {
				t.Errorf("%s: the interleaving was never seen without the mutant: the control proves nothing", c.fault)
			}
			if !res.OK() {
				t.Errorf("invariants violated without the mutant: %v (settled %v)", res.Verdict.Violations(), res.Settled)
			}
			t.Logf("control: %d of %d faults proven, verdict OK %v (%.0fs)", bit, len(res.Faults), res.OK(), time.Since(t0).Seconds())
		})
	}
}

// proven counts the faults of res proven to have happened.
func proven(res *chaos.Result) int {
	n := 0
	for _, f := range res.Faults {
		if f.Bit {
			n++
		}
	}
	return n
}
