package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/batonhq/baton/cmd/baton/internal/bench"
)

func benchCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "handover":
			return benchHandover(ctx, args[1:], stdout, stderr)
		case "latency":
			return benchLatency(ctx, args[1:], stdout, stderr)
		case "scale":
			return benchScale(ctx, args[1:], stdout, stderr)
		}
	}
	fs := newFlagSet("bench", "[flags]", `Benchmarks Baton against what you would otherwise write, side by side in one run: the same
job (fold keyed records from a real Kafka topic into PostgreSQL, exactly once, per-key order
kept) done by each design in a process of its own, in rotating order (every other round
backwards), every run's fold checked; a run whose fold is wrong does not count and makes the
command fail. The baton design is the README's first program itself (its handler, one
statement per record, into an SQLite file; checked from its twins table); baton-pg runs that
handler shape on PostgreSQL through pgfence, whose transaction pipelines the statements, and
baton-pg-sync the same without the pipelining, so the two are compared in one run. The
sqlite- designs fold into an SQLite file instead, the redis- designs into hashes on the Redis
server (its durability settings are printed with the results); kafka-read only reads the
topic. Prints records/s, the time to the first commit, p50/p99 transaction latency, peak RSS
and each design's ratio to Baton (baton-fast), to the ceiling and to the bound of reading and
writing on one machine; with -out, writes RESULTS.md (with the performance targets as measured)
and chart.svg there.

Designs: `+designNames()+`.
The slow ones (one transaction per record) run on a topic of -slow-records records.
Uses the services 'make up' starts ('eval "$(make -s env)"' exports their addresses). The
watermill design runs in a binary built from the nested module cmd/baton/internal/bench/peers (its
dependencies stay out of Baton's module graph): 'baton bench' builds it with 'go build' when
run inside the repository, or takes -peers.

'baton bench latency' measures end-to-end latency at a steady rate, 'baton bench scale' how
records/s, latency and memory grow with partitions, keys and record size, and 'baton bench
handover' the time partitions take to move between members: see their -h.
`, stderr)
	var (
		cfg                     bench.Config
		brokers, designs, conns string
		peers                   string
	)
	fs.IntVar(&cfg.Records, "records", 200_000, "records of the main topic")
	fs.IntVar(&cfg.Keys, "keys", 1000, "distinct keys")
	fs.IntVar(&cfg.Partitions, "partitions", 12, "topic partitions")
	fs.IntVar(&cfg.SlowRecords, "slow-records", 10_000, "records of the topic the slow designs (watermill, redislock, naive) run on")
	fs.IntVar(&cfg.Rounds, "rounds", 1, "rounds: every design runs once per round, the order rotating")
	fs.StringVar(&designs, "designs", "all", "designs to run, comma-separated")
	fs.StringVar(&conns, "conns", "1,2,4,8", "the ceiling's connection counts to try (the best counts)")
	fs.DurationVar(&cfg.Timeout, "timeout", 5*time.Minute, "bound of one design's run")
	fs.StringVar(&brokers, "brokers", os.Getenv("BATON_KAFKA_BROKERS"), "Kafka seed brokers (default $BATON_KAFKA_BROKERS)")
	fs.StringVar(&cfg.Postgres, "postgres", os.Getenv("BATON_POSTGRES_URL"), "PostgreSQL URL (default $BATON_POSTGRES_URL)")
	fs.StringVar(&cfg.Redis, "redis", os.Getenv("BATON_REDIS_ADDR"), "Redis address (default $BATON_REDIS_ADDR)")
	fs.StringVar(&peers, "peers", os.Getenv("BATON_BENCH_PEERS"), "the peers binary (default $BATON_BENCH_PEERS, else built from cmd/baton/internal/bench/peers)")
	fs.StringVar(&cfg.Profile, "profile", "", "directory to write each worker's CPU profile to (pprof; none if empty)")
	fs.StringVar(&cfg.Out, "out", "", "directory to write RESULTS.md and chart.svg to (none if empty)")
	benchFetchFlags(fs, &cfg.Fetch, true)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if designs != "all" {
		cfg.Designs = strings.Split(designs, ",")
	}
	for _, c := range strings.Split(conns, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil {
			return usageError{err: fmt.Errorf("-conns %q: %w", conns, err)}
		}
		cfg.Conns = append(cfg.Conns, n)
	}
	if brokers != "" {
		cfg.Brokers = strings.Split(brokers, ",")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cfg.Self = []string{self}
	cfg.Progress = stdout
	cfg.RedisFold = redisFold{addr: cfg.Redis}
	cfg.Command = strings.TrimSpace("baton bench " + strings.Join(args, " "))
	if err := cfg.Validate(); err != nil {
		return usageError{err: err}
	}
	if cfg.Designs == nil || slices.Contains(cfg.Designs, "watermill") {
		if peers == "" {
			dir, err := os.MkdirTemp("", "baton-bench-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			if peers, err = buildPeers(ctx, dir, stderr); err != nil {
				return err
			}
		}
		cfg.Peers = []string{peers}
	}
	_, err = bench.Run(ctx, cfg)
	return err
}

func designNames() string {
	var s []string
	for _, i := range bench.All {
		s = append(s, i.Name)
	}
	return strings.Join(s, ", ")
}

// buildPeers builds the peers binary into dir from the repository the working directory is
// in (the nested module cmd/baton/internal/bench/peers) and returns its path.
func buildPeers(ctx context.Context, dir string, stderr io.Writer) (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "baton-bench-peers")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	cmd.Dir = filepath.Join(root, "cmd", "baton", "internal", "bench", "peers")
	cmd.Stdout, cmd.Stderr = stderr, stderr
	fmt.Fprintf(stderr, "building the peers binary (watermill) in %s\n", cmd.Dir)
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build the peers binary: %w", err)
	}
	return bin, nil
}

// repoRoot finds Baton's repository at or above the working directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(b), "module github.com/batonhq/baton\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("the watermill design needs the peers binary: run 'baton bench' inside Baton's repository, pass -peers, or leave watermill out of -designs")
		}
		dir = parent
	}
}

// benchWorker serves one design of a 'baton bench' run, in its own process.
func benchWorker(ctx context.Context, args []string, stdout io.Writer) error {
	designs := bench.Designs()
	for name, d := range batonDesigns() {
		designs[name] = d
	}
	for name, d := range sqliteDesigns() {
		designs[name] = d
	}
	for name, d := range redisDesigns() {
		designs[name] = d
	}
	return bench.Serve(ctx, args, designs, stdout)
}

var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))
