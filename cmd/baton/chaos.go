package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/batonhq/baton/internal/operator/chaos"
)

func chaosCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("chaos", "[flags]", `A chaos run: worker processes of a Baton application against a real Kafka and PostgreSQL
(and Redis for -mode lock), faults injected while a keyed stream is produced, then a checker
reads what landed. Writes a verdict table and an SVG timeline to -report; exits 1 when an
invariant is violated.
`, stderr)
	var (
		cfg                      chaos.Config
		mode, faults, brokers    string
		pgURL, report, deployDir string
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
	fs.StringVar(&faults, "faults", "all", "fault kinds, comma-separated ('all': the worker, broker and database kinds; 'every': those, the coordinator and static-membership kinds, and the topic faults, which fenced runs only inject; the network kinds, which need root, are named one by one; net-minority-coordinator needs -kafka-nodes 3 and iptables): "+kinds())
	fs.IntVar(&cfg.NumFaults, "num-faults", 0, "faults to inject (default: 3 per kind)")
	fs.DurationVar(&cfg.For, "for", 0, "stop injecting faults after this long (0: no bound), then settle and check")
	fs.Int64Var(&cfg.Seed, "seed", 1, "random seed for targets and order")
	fs.DurationVar(&cfg.Settle, "settle", 90*time.Second, "bound for applying the backlog after the last fault")
	fs.DurationVar(&cfg.SessionTimeout, "session-timeout", 3*time.Second, "workers' Kafka session timeout")
	fs.StringVar(&brokers, "brokers", os.Getenv("BATON_KAFKA_BROKERS"), "Kafka seed brokers (default $BATON_KAFKA_BROKERS)")
	fs.StringVar(&pgURL, "postgres", os.Getenv("BATON_POSTGRES_URL"), "PostgreSQL URL (default $BATON_POSTGRES_URL)")
	fs.StringVar(&cfg.RedisAddr, "redis", os.Getenv("BATON_REDIS_ADDR"), "Redis address for -mode lock (default $BATON_REDIS_ADDR)")
	fs.StringVar(&deployDir, "deploy", "deploy/local", "directory of kafka.sh and postgres.sh, for restart faults")
	fs.StringVar(&report, "report", "chaos-report", "directory for the verdict, the timeline and the workers' logs")
	fs.IntVar(&cfg.KafkaNodes, "kafka-nodes", 0, "brokers of deploy/local's cluster mode (KAFKA_NODES) behind -brokers; needed by coordinator-kill and net-minority-coordinator (3 or more)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	m, err := chaos.ParseMode(mode)
	if err != nil {
		return usageError{err: err}
	}
	cfg.Mode = m
	if cfg.Faults, err = chaos.ParseFaults(faults); err != nil {
		return usageError{err: err}
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
	if cfg.DeployDir, err = filepath.Abs(deployDir); err != nil {
		return err
	}
	if cfg.KafkaNodes > 1 {
		cfg.ScriptEnv = append(cfg.ScriptEnv, fmt.Sprintf("KAFKA_NODES=%d", cfg.KafkaNodes))
	}
	cfg.Progress = stdout
	if err := os.MkdirAll(report, 0o755); err != nil {
		return err
	}
	cfg.LogDir = report // the workers' logs beside the verdict

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

func kinds() string {
	var s []string
	for _, k := range slices.Concat(chaos.EveryFault, chaos.NetFaults, chaos.MinorityFaults) {
		s = append(s, string(k))
	}
	return strings.Join(s, ",")
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
	svg := filepath.Join(dir, string(res.Config.Mode)+"-timeline.svg")
	f, err := os.Create(svg)
	if err != nil {
		return err
	}
	if err := chaos.WriteTimeline(context.WithoutCancel(ctx), f, db, res); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "report: %s, %s\n", name, svg)
	return nil
}
