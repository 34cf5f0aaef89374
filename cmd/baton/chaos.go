package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/batonhq/baton/internal/operator/chaos"
)

func chaosCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("chaos", "[flags]", `A chaos run: worker processes of a Baton application against a real Kafka and PostgreSQL
(and Redis for -mode lock), faults injected while a keyed stream is produced, then a checker
reads what landed. Writes the verdict table to -report/MODE-verdict.txt and the report to
-report/MODE/: index.html (the verdict, a summary of the faults, refused writes, backlog and apply
lag over time, links to the rest), lanes-NN.svg (a timeline of 16 partitions each) and faults.html (every
fault). Exits 1 when an invariant is violated.

With -overlap N (N > 1) up to N faults run at once on disjoint targets (what each kind holds,
below), drawn up front from -seed: the schedule (kind, earliest start, target, a seed per
fault) is printed and written to -report as <mode>-schedule.jsonl, one JSON object a line;
-replay FILE runs such a file again (same kinds, targets and order).

fault kinds (-faults):
`+kindsHelp(), stderr)
	var (
		cfg                      chaos.Config
		mode, faults, brokers    string
		pgURL, report, deployDir string
		shards                   string
		replay                   string
		keys, perKey             int
		partitions               int
	)
	fs.StringVar(&mode, "mode", "fenced", "fenced (Baton), unfenced (Kafka assignment alone) or lock (a naive Redis lease per partition)")
	fs.IntVar(&cfg.Workers, "workers", 3, "worker processes")
	fs.IntVar(&partitions, "partitions", 12, "topic partitions")
	fs.IntVar(&keys, "keys", 200, "distinct keys")
	fs.IntVar(&perKey, "per-key", 100, "records per key")
	fs.IntVar(&cfg.Rate, "rate", 500, "records produced per second")
	fs.IntVar(&cfg.Workload.CommandEvery, "command-every", 4, "fenced mode: send a device command through the outbox for every Nth update (0: none)")
	fs.StringVar(&faults, "faults", "all", "fault kinds, comma-separated (kind*N: drawn N times as often), or 'all' (the worker, broker and database kinds) or 'every' (every kind these services can run: coordinator-kill with -kafka-nodes, db-failover with a -postgres URL naming a standby, the network kinds as root; net-minority-coordinator with -kafka-nodes 3 and iptables, named one by one; the topic kinds in fenced mode; shard-outage with -shards)")
	fs.IntVar(&cfg.Overlap, "overlap", 0, "faults in flight at once, on disjoint targets (0 or 1: one after another)")
	fs.StringVar(&replay, "replay", "", "run this schedule file (a run's <mode>-schedule.jsonl) instead of drawing one from -seed; -faults and -num-faults are the file's")
	fs.IntVar(&cfg.NumFaults, "num-faults", 0, "faults to inject (default: 3 per kind)")
	fs.DurationVar(&cfg.For, "for", 0, "stop injecting faults after this long (0: no bound), then settle and check")
	fs.Int64Var(&cfg.Seed, "seed", 1, "random seed for targets and order")
	fs.DurationVar(&cfg.Settle, "settle", 90*time.Second, "bound for applying the backlog after the last fault")
	fs.DurationVar(&cfg.SessionTimeout, "session-timeout", 3*time.Second, "workers' Kafka session timeout")
	fs.StringVar(&brokers, "brokers", os.Getenv("BATON_KAFKA_BROKERS"), "Kafka seed brokers (default $BATON_KAFKA_BROKERS)")
	fs.StringVar(&pgURL, "postgres", os.Getenv("BATON_POSTGRES_URL"), "PostgreSQL URL (default $BATON_POSTGRES_URL)")
	fs.StringVar(&shards, "shards", "", "fenced mode: PostgreSQL databases of a sharded sink the workers write through (fence/shard), NAME=URL or URL, comma-separated, home first; -postgres then keeps the run's logs. shard-outage stops and restarts deploy/local/postgres-shards.sh's cluster of each non-home position (default $"+envShards+")")
	fs.StringVar(&cfg.RedisAddr, "redis", os.Getenv("BATON_REDIS_ADDR"), "Redis address for -mode lock (default $BATON_REDIS_ADDR)")
	fs.StringVar(&deployDir, "deploy", "deploy/local", "directory of kafka.sh and postgres.sh, for restart faults")
	fs.StringVar(&report, "report", "chaos-report", "directory for the verdict, the report and the workers' logs")
	fs.DurationVar(&cfg.Audit, "audit", 0, "run 'baton audit' beside the workers, one pass per group every this long (0: none); what it finds joins the verdict and fails the run")
	fs.IntVar(&cfg.KafkaNodes, "kafka-nodes", 0, "brokers of deploy/local's cluster mode (KAFKA_NODES) behind -brokers; needed by coordinator-kill and net-minority-coordinator (3 or more)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	m, err := chaos.ParseMode(mode)
	if err != nil {
		return usageError{err: err}
	}
	cfg.Mode = m
	if cfg.Audit < 0 {
		return usageError{err: fmt.Errorf("-audit %v: not negative (0: no auditor)", cfg.Audit)}
	}
	if cfg.Faults, err = chaos.ParseFaults(faults); err != nil {
		return usageError{err: err}
	}
	if replay != "" {
		b, err := os.ReadFile(replay)
		if err != nil {
			return usageError{err: err}
		}
		if cfg.Replay, err = chaos.ReadSchedule(bytes.NewReader(b)); err != nil {
			return usageError{err: err}
		}
		cfg.Faults, cfg.NumFaults = nil, 0
	}
	cfg.Partitions = int32(partitions)
	cfg.Workload.Keys, cfg.Workload.PerKey = keys, perKey
	if brokers == "" || pgURL == "" {
		return usageError{err: errors.New("needs -brokers and -postgres (or BATON_KAFKA_BROKERS and BATON_POSTGRES_URL); 'make up' starts both")}
	}
	if m == chaos.Lock && cfg.RedisAddr == "" {
		return usageError{err: errors.New("-mode lock needs -redis (or BATON_REDIS_ADDR)")}
	}
	cfg.Brokers = strings.Split(brokers, ",")
	named, err := shardURLs() // not the flag's default: help would print the URLs' passwords
	if shards != "" {
		named, err = parseShardURLs(shards)
	}
	if err != nil {
		return usageError{err: err}
	}
	for _, n := range named {
		cfg.ShardURLs = append(cfg.ShardURLs, n.URL) // named shard-1, shard-2, ... in the run, by position
	}
	if cfg.DeployDir, err = filepath.Abs(deployDir); err != nil {
		return err
	}
	if cfg.KafkaNodes > 1 {
		cfg.ScriptEnv = append(cfg.ScriptEnv, fmt.Sprintf("KAFKA_NODES=%d", cfg.KafkaNodes))
	}
	if faults == "every" && replay == "" {
		var skipped map[chaos.FaultKind]string
		cfg.Faults, skipped = chaos.EveryFor(cfg.KafkaNodes, pgURL)
		for _, k := range slices.Sorted(maps.Keys(skipped)) {
			fmt.Fprintf(stdout, "every: %s skipped: %s\n", k, skipped[k])
		}
	}
	cfg.Progress = stdout
	if err := os.MkdirAll(report, 0o755); err != nil {
		return err
	}
	cfg.LogDir = report // the workers' logs beside the verdict
	if cfg.Overlap > 1 || cfg.Replay != nil {
		cfg.ScheduleFile = filepath.Join(report, string(m)+"-schedule.jsonl")
	}

	res, db, cleanup, err := chaos.RunPostgres(ctx, cfg, pgURL)
	if cleanup != nil {
		defer cleanup()
	}
	if err != nil {
		return err
	}
	if err := writeReport(ctx, stdout, report, res, db); err != nil {
		return err
	}
	if !res.OK() {
		return fmt.Errorf("invariants violated (see %s)", report)
	}
	return nil
}

// kindsHelp lists every fault kind, what it holds while it runs and what it needs.
func kindsHelp() string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, k := range chaos.Kinds() {
		needs := k.Needs
		if needs == "" {
			needs = "-"
		}
		fmt.Fprintf(tw, "  %s\tholds %s\tneeds %s\n", k.Kind, k.Holds, needs)
	}
	_ = tw.Flush()
	return b.String()
}

func writeReport(ctx context.Context, stdout io.Writer, dir string, res *chaos.Result, db chaos.DB) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var b strings.Builder
	chaos.WriteVerdict(&b, res)
	fmt.Fprint(stdout, "\n"+b.String())
	name := filepath.Join(dir, string(res.Config.Mode)+"-verdict.txt")
	if err := os.WriteFile(name, []byte(b.String()), 0o644); err != nil {
		return err
	}
	report := filepath.Join(dir, string(res.Config.Mode))
	if err := chaos.WriteReport(context.WithoutCancel(ctx), report, db, res); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "report: %s, %s\n", name, filepath.Join(report, chaos.ReportIndex))
	return nil
}
