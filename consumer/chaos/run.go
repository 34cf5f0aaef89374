package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	engine "github.com/batonhq/baton/internal/operator/chaos"
)

// envArgs carries the harness process's command line to its workers, which parse the
// program's own flags from it so they see the same values.
const envArgs = "BATON_CHAOS_ARGS"

// Result is a run's verdict.
type Result struct {
	// Pass reports whether every invariant held and everything produced was processed within
	// the settle bound.
	Pass bool
	// Invariants are the harness's (no batch under a stale token, no offsets applied twice, no
	// two writers under one token, no frozen worker writing after its takeover, everything
	// processed in time) followed by the workload's, sorted by name. The harness's frozen-worker
	// invariant counts the frozen workers' write attempts: 0 checked means no freeze bit.
	Invariants []Invariant
	// Report is the directory holding verdict.txt, timeline.svg and the workers' logs ("" when
	// the run was given no -report).
	Report string
}

// Main runs w under chaos with the program's command line and exits: status 0 on PASS, 1 on
// FAIL or an error, 2 for a bad command line. Call it from the program's main, after defining
// the program's own flags on the flag package's command line (Main parses them with its own;
// the worker processes see the same values). The harness runs the program itself as each
// worker process; there Main runs the worker.
func Main(w Workload) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	res, err := Run(ctx, w, os.Args[1:], os.Stdout)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case errors.Is(err, engine.ErrUsage):
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	case res != nil && !res.Pass:
		os.Exit(1)
	}
	os.Exit(0)
}

// Run is [Main] without the exit: it parses args (the flags below, and the program's own
// defined on the flag package's command line), runs w under chaos, writes progress and the
// verdict table to out and returns the verdict. In a worker process (args as the harness
// starts it) it runs the worker until the harness stops it and returns a nil Result.
//
// Flags:
//
//	-brokers     Kafka seed brokers, comma-separated (default $BATON_KAFKA_BROKERS; empty: an embedded kfake cluster)
//	-postgres    PostgreSQL URL; the run gets a schema of its own (default $BATON_POSTGRES_URL; empty: an SQLite file)
//	-unfenced    run the same handlers on Kafka's assignment alone (no fence, outbox or inbox): the checker should fail it
//	-faults      faults, comma-separated: freeze, delay (PostgreSQL), kill, term, storm, group-delete (default freeze,kill)
//	-n           number of faults (default 3)
//	-workers     worker processes (default 3)
//	-partitions  partitions per topic (default 4)
//	-rate        records per second given to Produce (default 50)
//	-session-timeout, -settle, -seed, -report
//	-deploy      deploy/local, whose scripts broker-restart and db-restart run (restarting those services)
func Run(ctx context.Context, w Workload, args []string, out io.Writer) (*Result, error) {
	if len(args) > 0 && args[0] == engine.WorkerCommand {
		if err := parseOwn(os.Getenv(envArgs)); err != nil {
			return nil, fmt.Errorf("%w: %w", engine.ErrUsage, err)
		}
		return nil, engine.RunWorker(ctx, args[1:], app{w})
	}
	o, err := parse(args, out)
	if err != nil {
		return nil, err
	}
	return run(ctx, w, o, args, out)
}

// options are Run's flags.
type options struct {
	brokers, pgURL  string
	unfenced        bool
	faults          string
	n               int
	workers         int
	partitions      int
	rate            int
	session, settle time.Duration
	seed            int64
	report, deploy  string
	binary          string
}

// parse parses Run's flags and the program's own (flag.CommandLine's).
func parse(args []string, out io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet(filepath.Base(os.Args[0]), flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&o.brokers, "brokers", os.Getenv("BATON_KAFKA_BROKERS"), "Kafka seed brokers, comma-separated (default $BATON_KAFKA_BROKERS; empty: an embedded kfake cluster)")
	fs.StringVar(&o.pgURL, "postgres", os.Getenv("BATON_POSTGRES_URL"), "PostgreSQL URL; the run gets a schema of its own (default $BATON_POSTGRES_URL; empty: an SQLite file)")
	fs.BoolVar(&o.unfenced, "unfenced", false, "run the same handlers on Kafka's assignment alone (no fence, outbox or inbox): the checker should fail it")
	fs.StringVar(&o.faults, "faults", "freeze,kill", "faults, comma-separated: freeze, delay (PostgreSQL), kill, term, storm, group-delete; with -deploy also broker-restart, db-restart")
	fs.IntVar(&o.n, "n", 3, "number of faults")
	fs.IntVar(&o.workers, "workers", 3, "worker processes")
	fs.IntVar(&o.partitions, "partitions", 4, "partitions per topic")
	fs.IntVar(&o.rate, "rate", 50, "records per second given to the workload's Produce")
	fs.DurationVar(&o.session, "session-timeout", 2*time.Second, "the workers' Kafka session timeout")
	fs.DurationVar(&o.settle, "settle", 60*time.Second, "bound for processing everything after the last fault")
	fs.Int64Var(&o.seed, "seed", 1, "picks the faults' targets and order")
	fs.StringVar(&o.report, "report", "", "directory for verdict.txt, timeline.svg and the workers' logs (default: none)")
	fs.StringVar(&o.deploy, "deploy", "", "directory of deploy/local's kafka.sh and postgres.sh, for broker-restart and db-restart (they restart those services)")
	fs.StringVar(&o.binary, "worker-binary", "", "the program run as each worker (default: this one; for tests, whose binary is not the program)")
	flag.CommandLine.VisitAll(func(f *flag.Flag) {
		if fs.Lookup(f.Name) == nil {
			fs.Var(f.Value, f.Name, f.Usage)
		}
	})
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return o, err
		}
		return o, fmt.Errorf("%w: %w", engine.ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("%w: unexpected arguments %q", engine.ErrUsage, fs.Args())
	}
	return o, nil
}

// parseOwn parses the program's own flags from the harness process's command line (JSON).
func parseOwn(argsJSON string) error {
	if argsJSON == "" {
		return nil
	}
	var args []string
	if err := json.Unmarshal([]byte(argsJSON), &args); err != nil {
		return err
	}
	_, err := parse(args, io.Discard)
	return err
}

// allowed are the faults that touch only the run's own worker processes and group.
var allowed = map[engine.FaultKind]bool{engine.FaultFreeze: true, engine.FaultDelay: true, engine.FaultKill: true,
	engine.FaultTerm: true, engine.FaultStorm: true, engine.FaultGroupDelete: true}

func run(ctx context.Context, w Workload, o options, args []string, out io.Writer) (*Result, error) {
	faults, err := engine.ParseFaults(o.faults)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", engine.ErrUsage, err)
	}
	for _, f := range faults {
		restart := f == engine.FaultBrokerRestart || f == engine.FaultDBRestart
		if !allowed[f] && !(restart && o.deploy != "") {
			return nil, fmt.Errorf("%w: fault %s is not available here", engine.ErrUsage, f)
		}
	}
	ownArgs, err := json.Marshal(args)
	if err != nil {
		return nil, err
	}
	mode := engine.Fenced
	if o.unfenced {
		mode = engine.Unfenced
	}
	dir, err := os.MkdirTemp("", "baton-chaos-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	logDir := dir
	if o.report != "" {
		if err := os.MkdirAll(o.report, 0o755); err != nil {
			return nil, err
		}
		logDir = o.report
	}
	cfg := engine.Config{
		Mode: mode, App: app{w}, Workers: o.workers, Partitions: int32(o.partitions), Rate: o.rate,
		Faults: faults, NumFaults: o.n, Seed: o.seed, Settle: o.settle, SessionTimeout: o.session,
		Progress: out, LogDir: logDir, Binary: o.binary, DeployDir: o.deploy,
		WorkerEnv: []string{envArgs + "=" + string(ownArgs)},
	}
	if o.brokers == "" {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(500*time.Millisecond))
		if err != nil {
			return nil, fmt.Errorf("chaos: embedded Kafka: %w", err)
		}
		defer c.Close()
		cfg.Brokers = c.ListenAddrs()
		fmt.Fprintf(out, "Kafka: embedded (kfake) on %s\n", strings.Join(cfg.Brokers, ","))
	} else {
		cfg.Brokers = strings.Split(o.brokers, ",")
		fmt.Fprintf(out, "Kafka: %s\n", o.brokers)
	}
	var (
		res     *engine.Result
		db      engine.DB
		cleanup func()
	)
	if o.pgURL != "" {
		fmt.Fprintln(out, "database: PostgreSQL (a schema of the run's own)")
		res, db, cleanup, err = engine.RunPostgres(ctx, cfg, o.pgURL)
	} else {
		path := filepath.Join(dir, "run.db")
		fmt.Fprintf(out, "database: SQLite %s\n", path)
		res, db, cleanup, err = engine.RunSQLite(ctx, cfg, path)
	}
	if cleanup != nil {
		defer cleanup()
	}
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	engine.WriteVerdict(&b, res)
	fmt.Fprint(out, "\n"+b.String())
	r := verdict(res)
	if o.report != "" {
		r.Report = o.report
		if err := writeReport(context.WithoutCancel(ctx), o.report, b.String(), res, db); err != nil {
			return r, err
		}
		fmt.Fprintf(out, "report: %s\n", o.report)
	}
	return r, nil
}

// verdict is the public view of the harness's result.
func verdict(res *engine.Result) *Result {
	v := res.Verdict
	late := int64(0)
	if !res.Settled {
		late = 1
	}
	r := &Result{Pass: res.OK(), Invariants: []Invariant{
		{Name: "no batch commits under a stale token", Checked: v.Batches, Violations: v.StaleCommits},
		{Name: "no batch applies offsets already applied", Checked: v.Batches, Violations: v.OverlapBatches},
		{Name: "no two workers commit under one token", Checked: v.Batches, Violations: v.SameTokenWriters},
		{Name: "no frozen worker writes after its takeover", Checked: v.ZombieAttempts, Violations: v.ZombieOverTaken},
		{Name: "everything produced is processed within the settle bound", Checked: 1, Violations: late},
	}}
	for _, i := range v.Invariants {
		r.Invariants = append(r.Invariants, Invariant(i))
	}
	return r
}

func writeReport(ctx context.Context, dir, table string, res *engine.Result, db engine.DB) error {
	if err := os.WriteFile(filepath.Join(dir, "verdict.txt"), []byte(table), 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "timeline.svg"))
	if err != nil {
		return err
	}
	if err := engine.WriteTimeline(ctx, f, db, res); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
