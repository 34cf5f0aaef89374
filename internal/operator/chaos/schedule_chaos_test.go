package chaos_test

// Overlapping faults on the real services: a short run of mixed kinds on the single broker, its
// replay from the schedule file it wrote, and the sample of every kind on the three-broker
// cluster and the PostgreSQL primary with its standby.

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/operator/chaos"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// overlapRuns skips the overlapping runs unless BATON_CHAOS_OVERLAPPING is set (make
// gotest-faults and gotest-sample set it): each takes minutes of services of its own, more than
// a developer's go test ./... should spend unasked.
func overlapRuns(t *testing.T) {
	t.Helper()
	if os.Getenv("BATON_CHAOS_OVERLAPPING") == "" {
		t.Skip("set BATON_CHAOS_OVERLAPPING=1 to run the overlapping chaos runs")
	}
}

// provenPairs counts the pairs of proven faults whose intervals intersect.
func provenPairs(faults []chaos.Fault) int {
	n := 0
	for i, f := range faults {
		for _, g := range faults[i+1:] {
			if f.Bit && g.Bit && f.Start.Before(g.End) && g.Start.Before(f.End) {
				n++
			}
		}
	}
	return n
}

// TestChaosOverlap runs twelve faults of six kinds with up to three in flight on the single
// broker: faults must have run at once (proven ones among them), every invariant must hold, and
// the schedule file must hold the run's schedule. Its replay from that file runs the same
// kinds on the same targets in the same order, under the same verdict.
func TestChaosOverlap(t *testing.T) {
	overlapRuns(t)
	kinds := []chaos.FaultKind{chaos.FaultFreeze, chaos.FaultKill, chaos.FaultBrokerRestart, chaos.FaultDelay, chaos.FaultTerm, chaos.FaultDBRestart}
	file := filepath.Join(t.TempDir(), "schedule.jsonl")
	res, _ := runWith(t, chaos.Fenced, kinds, 12, func(c *chaos.Config) { c.Overlap, c.ScheduleFile = 3, file })
	if !res.OK() {
		t.Errorf("invariants violated: %v (settled %v)", res.Verdict.Violations(), res.Settled)
	}
	if len(res.Faults) != 12 || len(res.Schedule) != 12 {
		t.Fatalf("%d faults run of %d scheduled, want 12 of 12", len(res.Faults), len(res.Schedule))
	}
	if res.MaxInFlight < 2 || res.Concurrent < 2 || provenPairs(res.Faults) == 0 {
		t.Errorf("faults did not overlap: %d at most in flight, %d ran beside another, %d pairs of proven faults at once", res.MaxInFlight, res.Concurrent, provenPairs(res.Faults))
	}
	for _, f := range res.Faults {
		if !f.Bit && f.Kind != chaos.FaultFreeze && f.Kind != chaos.FaultDelay {
			t.Errorf("fault %d %s on %s did not happen: %s", f.N, f.Kind, f.Target, f.Detail)
		}
	}
	checkZombies(t, res)
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	sched, err := chaos.ReadSchedule(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(sched, res.Schedule) {
		t.Fatalf("the schedule file differs from the run's schedule:\n%s", b)
	}
	if t.Failed() {
		return
	}
	t.Run("replay", func(t *testing.T) {
		again, _ := runWith(t, chaos.Fenced, kinds, 0, func(c *chaos.Config) { c.Seed, c.Replay = 99, sched })
		if !reflect.DeepEqual(again.Schedule, res.Schedule) {
			t.Errorf("the replay ran another schedule:\n%v\nwant:\n%v", again.Schedule, res.Schedule)
		}
		if len(again.Faults) != len(res.Faults) {
			t.Fatalf("the replay ran %d faults, want %d", len(again.Faults), len(res.Faults))
		}
		for i, f := range again.Faults { // in the order the scheduler started them
			if f.N != i+1 || f.Kind != sched[i].Kind {
				t.Errorf("replayed fault %d is schedule entry %d, a %s; want entry %d, a %s", i+1, f.N, f.Kind, i+1, sched[i].Kind)
			}
		}
		if !again.OK() {
			t.Errorf("invariants violated in the replay: %v (settled %v)", again.Verdict.Violations(), again.Settled)
		}
	})
}

// sampleRepeated are the kinds the sample runs more than once: those that share the run with
// others (a worker, a broker, the database) and take seconds, not minutes.
var sampleRepeated = []chaos.FaultKind{
	chaos.FaultFreeze, chaos.FaultKill, chaos.FaultNetBrokerCut, chaos.FaultTerm, chaos.FaultNetFlaky,
	chaos.FaultDelay, chaos.FaultNetHealMidTx, chaos.FaultBrokerRestart, chaos.FaultNetDBCut,
	chaos.FaultTwoTopicInbox, chaos.FaultDBRestart,
}

// sampleKinds is the sample's schedule of n kinds (n at least as many as kinds and twice):
// every kind once, the kinds that share the run first, then sampleRepeated's again, then the
// kinds that hold everything, which run alone, last, and twice again after them (kinds whose
// proof can fail for a reason of the cluster's own). The scheduler takes a list as long as its
// faults in its order, so the sample's composition is fixed, whatever the seed.
func sampleKinds(kinds, twice []chaos.FaultKind, n int) []chaos.FaultKind {
	alone := map[chaos.FaultKind]bool{}
	for _, k := range chaos.Kinds() {
		alone[k.Kind] = k.Holds == chaos.HoldEverything
	}
	var shared, last []chaos.FaultKind
	for _, k := range kinds {
		if alone[k] {
			last = append(last, k)
		} else {
			shared = append(shared, k)
		}
	}
	last = append(last, twice...)
	out := shared
	for i := 0; len(out)+len(last) < n; i++ {
		out = append(out, sampleRepeated[i%len(sampleRepeated)])
	}
	return append(out, last...)
}

// TestSampleKinds checks the sample's composition: as many kinds as faults, every kind, the
// kinds that run alone last, the minority coordinator twice.
func TestSampleKinds(t *testing.T) {
	kinds := slices.Concat(chaos.EveryFault, chaos.FailoverFaults, chaos.NetFaults, chaos.MinorityFaults)
	got := sampleKinds(kinds, chaos.MinorityFaults, 40)
	if len(got) != 40 {
		t.Fatalf("%d kinds for 40 faults", len(got))
	}
	for _, k := range kinds {
		if !slices.Contains(got, k) {
			t.Errorf("kind %s not in the sample", k)
		}
	}
	alone := slices.Clone(chaos.MinorityFaults) // run twice
	for _, k := range chaos.Kinds() {
		if k.Holds == chaos.HoldEverything && slices.Contains(kinds, k.Kind) {
			alone = append(alone, k.Kind)
		}
	}
	last := slices.Clone(got[len(got)-len(alone):])
	slices.Sort(last)
	slices.Sort(alone)
	if len(alone) == 0 || !slices.Equal(last, alone) {
		t.Errorf("the sample ends with %v, want the kinds that run alone, %v", got[len(got)-len(alone):], alone)
	}
}

// TestChaosOverlapEvery is the sample of overlapping faults (lane C of make test; make
// gotest-sample runs it alone): 40 faults (BATON_CHAOS_FAULTS in a longer run) of every kind
// the three-broker cluster and a PostgreSQL primary with a synchronous standby can run (the
// failover, network and minority-coordinator kinds among them; sampleKinds says in what
// order), up to BATON_CHAOS_OVERLAP (default 4) in flight.
// Every kind must run and be proven at least once, faults must have run at once, the zombies'
// writes must be refused, every invariant must hold and baton audit beside the run must find
// nothing. It needs root for the network kinds (CI has it).
func TestChaosOverlapEvery(t *testing.T) {
	overlapRuns(t)
	needMinority(t)
	t.Cleanup(func() { noNetLeftovers(t) })
	brokers, clusterEnv := cluster(t)
	url, pgEnv := replica(t, "sync")
	overlap := 4
	if v := os.Getenv("BATON_CHAOS_OVERLAP"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("BATON_CHAOS_OVERLAP=%q: want a positive number", v)
		}
		overlap = n
	}
	kinds := slices.Concat(chaos.EveryFault, chaos.FailoverFaults, chaos.NetFaults, chaos.MinorityFaults)
	n := max(soak(t, 40), len(kinds)+len(chaos.MinorityFaults))
	ctx := testenv.Context(t, 3*time.Hour)
	var progress bytes.Buffer
	logDir := t.TempDir()
	if d := os.Getenv("BATON_CHAOS_LOGS"); d != "" {
		logDir = d
	}
	cfg := chaos.Config{
		Mode: chaos.Fenced, Workers: 3, Partitions: 6, LogDir: logDir,
		Workload: chaos.Workload{Keys: 60, PerKey: 10, CommandEvery: 2}, Rate: 300,
		Faults: sampleKinds(kinds, chaos.MinorityFaults, n), NumFaults: n, Seed: 11, Overlap: overlap,
		Brokers: brokers, KafkaNodes: 3, ScriptEnv: slices.Concat(clusterEnv, pgEnv),
		Binary: binary(t), DeployDir: deployDir(t), LoadFiller: 8000,
		ScheduleFile: filepath.Join(logDir, "schedule.jsonl"),
		Progress:     &progress, Settle: 2 * time.Minute, Audit: time.Second,
	}
	t0 := time.Now()
	res, _, cleanup, err := chaos.RunPostgres(ctx, cfg, url)
	if cleanup != nil {
		defer cleanup()
	}
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatalf("chaos run: %v", err)
	}
	var verdict bytes.Buffer
	chaos.WriteVerdict(&verdict, res)
	took := time.Since(t0)
	t.Logf("verdict (%.0fs, %.1f faults a minute of injection):\n%s", took.Seconds(), perMinute(res), verdict.String())
	if !res.OK() {
		t.Errorf("invariants violated: %v (settled %v)", res.Verdict.Violations(), res.Settled)
	}
	if len(res.Faults) != n {
		t.Errorf("%d faults run of %d scheduled", len(res.Faults), n)
	}
	injected, proven := map[chaos.FaultKind]int{}, map[chaos.FaultKind]int{}
	for _, f := range res.Faults {
		injected[f.Kind]++
		if f.Bit {
			proven[f.Kind]++
		} else {
			t.Logf("fault %d %s on %s unproven: %s", f.N, f.Kind, f.Target, f.Detail)
		}
	}
	for _, k := range kinds {
		if injected[k] == 0 || proven[k] == 0 {
			t.Errorf("kind %s: %d injected, %d proven (want at least one proven)", k, injected[k], proven[k])
		}
	}
	if res.MaxInFlight < 2 || provenPairs(res.Faults) == 0 {
		t.Errorf("faults did not overlap: %d at most in flight, %d pairs of proven faults at once", res.MaxInFlight, provenPairs(res.Faults))
	}
	checkZombies(t, res)
	if res.Verdict.CommandsInverted == 0 {
		t.Errorf("the receiver never read a key out of order across its two topics: the inbox scope was not put to the test")
	}
	if a := res.Audit; len(a.Violations) != 0 || a.Partitions == 0 {
		t.Errorf("baton audit: %d violations (want 0: %v), %d fences judged (want some)", len(a.Violations), a.Violations, a.Partitions)
	}
}

// checkZombies requires the held writes of the proven freezes and delays (a takeover seen) to
// have been refused or aborted. (A held write whose takeover never came, as when the broker
// was down all along, commits as its owner's: OK counts a zombie's commit after a takeover.)
func checkZombies(t *testing.T, res *chaos.Result) {
	t.Helper()
	made := int64(0)
	for _, f := range res.Faults {
		if f.Bit && (f.Kind == chaos.FaultFreeze || f.Kind == chaos.FaultDelay) {
			made++
		}
	}
	v := res.Verdict
	if made == 0 {
		t.Errorf("no freeze or delay led to a takeover: no zombie was made")
	}
	if got := v.ZombieRefused + v.ZombieAborted; got < made || v.ZombieOverTaken != 0 {
		t.Errorf("%d frozen holders were taken over; %d of their writes were refused or aborted (want as many), %d committed after their takeover (want 0)", made, got, v.ZombieOverTaken)
	}
}

// perMinute is the run's proven faults a minute, from its first fault's start to its last
// fault's end.
func perMinute(res *chaos.Result) float64 {
	if len(res.Faults) == 0 {
		return 0
	}
	from, to := res.Faults[0].Start, res.Faults[0].End
	n := 0
	for _, f := range res.Faults {
		if f.End.After(to) {
			to = f.End
		}
		if f.Bit {
			n++
		}
	}
	return float64(n) / to.Sub(from).Minutes()
}
