package chaos

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestShardConfig: a sharded sink runs the built-in workload, fenced, with the run's logs in
// PostgreSQL and without commands; shard-outage needs one of two shards or more and DeployDir;
// the kinds that cannot run over it are refused.
func TestShardConfig(t *testing.T) {
	base := func() Config {
		return Config{Brokers: []string{"k:1"}, PostgresURL: "postgres://h/logs", Binary: "/bin/true", DeployDir: "/deploy",
			ShardURLs: []string{"postgres://a/db", "postgres://b/db"}, Workload: Workload{Keys: 10, PerKey: 1, CommandEvery: 4},
			Faults: []FaultKind{FaultShardOutage, FaultFreeze}}
	}
	c := base()
	if err := c.defaults(); err != nil {
		t.Fatalf("a sharded run: %v", err)
	}
	if c.Workload.CommandEvery != 0 {
		t.Errorf("CommandEvery %d over a sharded sink, want 0 (no outbox per shard)", c.Workload.CommandEvery)
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"one shard", func(c *Config) { c.ShardURLs = c.ShardURLs[:1] }, "two shards or more"},
		{"no shards", func(c *Config) { c.ShardURLs = nil }, "two shards or more"},
		{"no deploy dir", func(c *Config) { c.DeployDir = "" }, "DeployDir"},
		{"unfenced", func(c *Config) { c.Mode = Unfenced }, "built-in workload, fenced"},
		{"redis sink", func(c *Config) { c.RedisSink = "r:1" }, "built-in workload, fenced"},
		{"sqlite logs", func(c *Config) { c.PostgresURL, c.SQLitePath = "", "x.db" }, "built-in workload, fenced"},
		{"audit", func(c *Config) { c.Audit = time.Second }, "auditor"},
		{"topic fault", func(c *Config) { c.Faults = append(c.Faults, FaultTopicGrow) }, "does not run over a sharded sink"},
		{"network fault", func(c *Config) { c.Faults = append(c.Faults, FaultNetDBCut) }, "does not run over a sharded sink"},
	} {
		c := base()
		tc.edit(&c)
		err := c.defaults()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
	if ks, err := ParseFaults("shard-outage,freeze"); err != nil || len(ks) != 2 || ks[0] != FaultShardOutage {
		t.Errorf("ParseFaults(shard-outage,freeze) = %v, %v", ks, err)
	}
}

// TestShardOutageIsolated: an outage counts as isolating only when it was proven (refused,
// pending records, back, caught up) and the other shards applied records during it.
func TestShardOutageIsolated(t *testing.T) {
	ok := ShardOutage{Shard: "shard-2", Partitions: []int32{1, 4}, Down: 6 * time.Second, Refused: true, Pending: 100,
		Back: true, CaughtUp: time.Second, Others: 1800, OthersGap: time.Second, OthersGapPart: 3}
	if !ok.Isolated() || !strings.HasPrefix(ok.Verdict(), "isolated: other shards applied 1800 records during 6.0 s of outage") {
		t.Errorf("%+v: isolated %v, verdict %q", ok, ok.Isolated(), ok.Verdict())
	}
	for name, edit := range map[string]func(*ShardOutage){
		"never refused":   func(o *ShardOutage) { o.Refused = false },
		"nothing pending": func(o *ShardOutage) { o.Pending = 0 },
		"not back":        func(o *ShardOutage) { o.Back = false },
		"not caught up":   func(o *ShardOutage) { o.CaughtUp = 0 },
		"others stalled":  func(o *ShardOutage) { o.Others = 0 },
	} {
		o := ok
		edit(&o)
		if o.Isolated() || !strings.HasPrefix(o.Verdict(), "NOT isolated") {
			t.Errorf("%s: isolated %v, verdict %q", name, o.Isolated(), o.Verdict())
		}
	}
}

// TestShardOutageChecksTheCluster: shard-outage stops a shard only if its URL names the server
// of deploy/local's cluster at its position (postgres-shards.sh env, which starts nothing).
func TestShardOutageChecksTheCluster(t *testing.T) {
	deploy, err := filepath.Abs("../../../deploy/local")
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{cfg: Config{DeployDir: deploy, ScriptEnv: []string{"PG_SHARD_PORT=47441", "PG_SHARDS=3", "PG_HOST=127.0.0.1"}},
		shards: &shardRun{urls: []string{
			"postgres://u:p@127.0.0.1:47441/db?search_path=s",
			"postgres://u:p@127.0.0.1:47442/db?search_path=s",
			"postgres://u:p@127.0.0.1:15442/db?search_path=s", // not the script's third cluster
			"postgres://u:p@127.0.0.1:47444/db?search_path=s", // beyond its three
		}}}
	ctx := t.Context()
	if err := h.sameCluster(ctx, 1); err != nil {
		t.Errorf("shard-2 on the script's cluster 2: %v", err)
	}
	if err := h.sameCluster(ctx, 2); err == nil || !strings.Contains(err.Error(), "127.0.0.1:47443") {
		t.Errorf("shard-3 on another server: %v, want an error naming the script's cluster", err)
	}
	if err := h.sameCluster(ctx, 3); err == nil || !strings.Contains(err.Error(), "3 clusters") {
		t.Errorf("shard-4 beyond the script's clusters: %v, want an error", err)
	}
}
