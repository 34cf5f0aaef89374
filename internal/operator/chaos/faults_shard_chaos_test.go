package chaos_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/operator/chaos"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// shardURLs returns deploy/local's shard clusters (BATON_POSTGRES_SHARD_URLS, home first), or
// skips the test (fails it in CI) when they are not up.
func shardURLs(t *testing.T, n int) []string {
	t.Helper()
	v := os.Getenv("BATON_POSTGRES_SHARD_URLS")
	urls := strings.Split(v, ",")
	if v == "" || len(urls) < n {
		msg := fmt.Sprintf("BATON_POSTGRES_SHARD_URLS does not name %d clusters: start them with BATON_PG_SHARDS=%d make up and export what make env prints", n, n)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return urls[:n]
}

// TestChaosShardOutage runs Baton's workers over a sharded sink of three PostgreSQL clusters
// (deploy/local/postgres-shards.sh) while each non-home shard's database is stopped for a while
// and restarted, a worker is frozen past its session timeout, and the group is deleted (every
// partition's epoch regresses, recovered in its shard). Nothing may be lost or
// applied twice, no zombie write may commit, each outage must be proven (the shard refused
// connections, records of its partitions were pending, it came back and caught up) and the
// other shards' partitions must have applied records during it.
func TestChaosShardOutage(t *testing.T) {
	urls := shardURLs(t, 3)
	brokers := testenv.KafkaBrokers(t)
	pool, schema := testenv.Postgres(t)
	url := testenv.PostgresURL(t)
	deploy, err := filepath.Abs("../../../deploy/local")
	if err != nil {
		t.Fatal(err)
	}
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
	logDir := t.TempDir()
	if d := os.Getenv("BATON_CHAOS_LOGS"); d != "" {
		logDir = d // kept after the run, to read a failure's worker logs
	}
	cfg := chaos.Config{
		Mode: chaos.Fenced, Workers: 3, Partitions: 12, LogDir: logDir,
		Workload: chaos.Workload{Keys: 120, PerKey: 20}, Rate: 600,
		Faults:  []chaos.FaultKind{chaos.FaultShardOutage, chaos.FaultFreeze, chaos.FaultShardOutage, chaos.FaultGroupDelete},
		Seed:    42,
		Brokers: brokers, PostgresURL: url + sep + "search_path=" + schema, ShardURLs: urls,
		Binary: binary(t), DeployDir: deploy, Progress: &progress, Settle: 90 * time.Second,
	}
	cfg.NumFaults = len(cfg.Faults)
	res, err := chaos.Run(ctx, cfg, db)
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatalf("chaos run: %v", err)
	}
	var verdict bytes.Buffer
	chaos.WriteVerdict(&verdict, res)
	t.Logf("verdict:\n%s", verdict.String())

	v := res.Verdict
	if !res.OK() {
		t.Errorf("invariants violated: %v (settled %v)", v.Violations(), res.Settled)
	}
	if v.Lost != 0 || v.Duplicated != 0 || v.Applied != v.Expected || v.Expected == 0 {
		t.Errorf("%d records lost, %d duplicated, %d applied of %d", v.Lost, v.Duplicated, v.Applied, v.Expected)
	}
	zombies, deletes := 0, 0
	for _, f := range res.Faults {
		if f.Kind == chaos.FaultFreeze && f.Bit {
			zombies++
		}
		if f.Kind == chaos.FaultGroupDelete && f.Bit {
			deletes++
		}
		if !f.Bit {
			t.Errorf("fault %s on %s was not proven: %s", f.Kind, f.Target, f.Detail)
		}
	}
	if zombies == 0 {
		t.Errorf("the freeze led to no takeover: no zombie was made")
	}
	if v.ZombieRefused+v.ZombieAborted < int64(zombies) || v.ZombieCommitted != 0 {
		t.Errorf("%d zombies made: %d of their writes refused, %d aborted, %d committed", zombies, v.ZombieRefused, v.ZombieAborted, v.ZombieCommitted)
	}
	// The group's deletion regresses every partition's epoch: each shard records its era
	// advances, which the harness copies for the checker.
	if deletes == 0 || v.Recoveries == 0 {
		t.Errorf("group deleted %d times, %d era advances recorded in the shards (want both > 0)", deletes, v.Recoveries)
	}
	if len(res.ShardOutages) != 2 {
		t.Fatalf("%d shard outages measured, want 2", len(res.ShardOutages))
	}
	stopped := map[string]bool{}
	for _, o := range res.ShardOutages {
		t.Logf("outage: %s", o)
		stopped[o.Shard] = true
		if !o.Isolated() {
			t.Errorf("outage of %s did not isolate: %s", o.Shard, o)
		}
		if len(o.Partitions) == 0 || o.Down < 5*time.Second {
			t.Errorf("outage of %s: partitions %v, down %s (want some, at least 5s)", o.Shard, o.Partitions, o.Down)
		}
	}
	if stopped["shard-1"] || len(stopped) != 2 {
		t.Errorf("shards stopped: %v, want shard-2 and shard-3 (never the home shard)", stopped)
	}
}
