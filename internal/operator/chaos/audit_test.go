package chaos_test

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/operator/audit"
	"github.com/batonhq/baton/internal/operator/chaos"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/outbox/pgoutbox"
)

// The online auditor beside two short runs whose only fault is a frozen worker (no service is
// restarted): a fenced run, in which it judges every fence, compares the claims with the
// group's owners and finds nothing; and the unfenced baseline, which records no fences, in
// which it finds the members committing offsets on partitions no fence claims (the ownership
// check) and nothing else: it cannot see a zombie's write without a fence. CI runs the auditor
// beside TestChaosFenced and TestChaosBaselines instead (they carry its verdict), so this
// test, for a machine whose services must not be restarted, is skipped there.
func TestAuditBesideFreezeRuns(t *testing.T) {
	if os.Getenv("CI") != "" {
		t.Skip("CI runs the auditor beside TestChaosFenced and TestChaosBaselines")
	}
	bin := binary(t)
	t.Run("fenced", func(t *testing.T) {
		res, verdict := auditRun(t, bin, chaos.Fenced)
		a := res.Audit
		if !res.OK() {
			t.Errorf("the fenced run failed: %v", res.Verdict.Violations())
		}
		if len(a.Violations) != 0 {
			t.Errorf("the auditor found %d violations in a fenced run: %v", len(a.Violations), a.Violations)
		}
		// The run had a frozen owner taken over, and the auditor saw it all: passes while the
		// workers ran, every partition of both groups judged, the claims matched with owners.
		if a.Passes < 10 || a.Partitions < 8 || a.Owned == 0 && classicGroup() {
			t.Errorf("the auditor made %d passes, judged %d fences and compared %d with their owner: want at least 10, 8 (4 partitions, 2 groups) and 1", a.Passes, a.Partitions, a.Owned)
		}
		if !regexp.MustCompile(`baton audit: ownership violations +0\n`).MatchString(verdict) {
			t.Errorf("the verdict has no audit lines:\n%s", verdict)
		}
	})
	t.Run("unfenced", func(t *testing.T) {
		res, verdict := auditRun(t, bin, chaos.Unfenced)
		a := res.Audit
		if a.Partitions != 0 {
			t.Errorf("the auditor judged %d fences in an unfenced run, which records none", a.Partitions)
		}
		if a.ByCheck[audit.Ownership] == 0 {
			t.Errorf("the auditor found no member committing on a partition no fence claims: %v", a.Violations)
		}
		for _, v := range a.Violations {
			if v.Check != audit.Ownership || !strings.Contains(v.What, "no fence claims") {
				t.Errorf("unexpected violation in an unfenced run: %v", v)
			}
		}
		if res.OK() || !strings.Contains(verdict, "violations found by baton audit") {
			t.Errorf("the verdict does not fail the run with the auditor's violations:\n%s", verdict)
		}
	})
}

// classicGroup reports whether the workers join with the classic group protocol, whose
// assignments the auditor reads (it does not describe a KIP-848 group's).
func classicGroup() bool {
	p := os.Getenv("BATON_GROUP_PROTOCOL")
	return p == "" || p == "classic"
}

// auditRun is a short chaos run in mode with one freeze fault and the auditor beside it, a
// pass every half second.
func auditRun(t *testing.T, bin string, mode chaos.Mode) (*chaos.Result, string) {
	t.Helper()
	return auditRunFaults(t, bin, mode, []chaos.FaultKind{chaos.FaultFreeze}, 1)
}

func auditRunFaults(t *testing.T, bin string, mode chaos.Mode, faults []chaos.FaultKind, n int) (*chaos.Result, string) {
	t.Helper()
	brokers := testenv.KafkaBrokers(t)
	pool, schema := testenv.Postgres(t)
	url := testenv.PostgresURL(t)
	ctx := testenv.Context(t, 5*time.Minute)
	db := chaos.PgDB(pool)
	store, err := pgfence.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	box, err := pgoutbox.New(pool, store)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []func() error{func() error { return store.Migrate(ctx) }, func() error { return chaos.Migrate(ctx, db) }, func() error { return box.Migrate(ctx) }} {
		if err := m(); err != nil {
			t.Fatal(err)
		}
	}
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	var progress bytes.Buffer
	cfg := chaos.Config{
		Mode: mode, Workers: 2, Partitions: 4, LogDir: t.TempDir(),
		Workload: chaos.Workload{Keys: 40, PerKey: 10, CommandEvery: 4}, Rate: 400,
		Faults: faults, NumFaults: n, Seed: 7,
		Brokers: brokers, PostgresURL: url + sep + "search_path=" + schema, Binary: bin, RedisAddr: os.Getenv("BATON_REDIS_ADDR"),
		Progress: &progress, Settle: time.Minute, Audit: 500 * time.Millisecond,
	}
	res, err := chaos.Run(ctx, cfg, db)
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatalf("chaos run: %v", err)
	}
	var verdict bytes.Buffer
	chaos.WriteVerdict(&verdict, res)
	t.Logf("verdict:\n%s", verdict.String())
	if res.Audit == nil {
		t.Fatal("no audit verdict with Config.Audit set")
	}
	bit := false
	for _, f := range res.Faults {
		bit = bit || f.Kind == chaos.FaultFreeze && f.Bit
	}
	if !bit && n == 1 {
		t.Fatal("the frozen worker was not taken over: nothing was put to the test")
	}
	return res, verdict.String()
}
