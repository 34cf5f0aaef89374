package chaos_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/operator/chaos"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// TestRedisSinkUnderFaults is a fenced run with Redis as the sink, on a redis-server of the
// test's own (appendonly yes, appendfsync always: the shared one is never restarted), under a
// worker frozen past its session timeout and resumed, a killed worker and a Redis killed and
// restarted on its append-only file: nothing lost, nothing applied twice, no stale or
// overlapping commit, and the frozen worker's write refused by the fence. Bounded for CI.
func TestRedisSinkUnderFaults(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	srv := testenv.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	ctx := testenv.Context(t, 5*time.Minute)
	var progress bytes.Buffer
	logDir := t.TempDir()
	if d := os.Getenv("BATON_CHAOS_LOGS"); d != "" {
		logDir = d
	}
	start := time.Now()
	cfg := chaos.Config{
		Mode: chaos.Fenced, Workers: 3, Partitions: 6, LogDir: logDir,
		Workload: chaos.Workload{Keys: 60, PerKey: 20}, Rate: 600,
		Faults:    []chaos.FaultKind{chaos.FaultFreeze, chaos.FaultKill, chaos.FaultRedisRestart},
		NumFaults: 3, Seed: 7, SessionTimeout: 2 * time.Second, Settle: time.Minute,
		Brokers: brokers, Binary: binary(t), Progress: &progress,
		RedisSink: srv.Addr,
		RedisRestart: func(context.Context) error {
			srv.Kill()
			return srv.Start()
		},
	}
	res, _, cleanup, err := chaos.RunSQLite(ctx, cfg, filepath.Join(t.TempDir(), "chaos.db"))
	if cleanup != nil {
		defer cleanup()
	}
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatalf("chaos run: %v", err)
	}
	var verdict bytes.Buffer
	chaos.WriteVerdict(&verdict, res)
	t.Logf("verdict (%s):\n%s", time.Since(start).Round(time.Second), verdict.String())
	v := res.Verdict
	if !res.OK() {
		t.Fatalf("the run failed: %v (settled %v)", v.Violations(), res.Settled)
	}
	if v.Applied != v.Expected || v.Expected == 0 || v.Batches == 0 {
		t.Fatalf("%d records applied in %d batches, %d expected", v.Applied, v.Batches, v.Expected)
	}
	for _, f := range res.Faults {
		if !f.Bit {
			t.Errorf("fault %s on %s did not bite: %s", f.Kind, f.Target, f.Detail)
		}
	}
	if v.ZombieRefused < 1 || v.ZombieCommitted != 0 {
		t.Errorf("zombie writes: %d refused as stale, %d committed; want at least one refused and none committed", v.ZombieRefused, v.ZombieCommitted)
	}
}
