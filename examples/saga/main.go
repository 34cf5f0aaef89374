package main

import (
	"context"
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

	"github.com/batonhq/baton/internal/chaos"
)

// envStepTimeout carries the step timeout from the harness's process to the workers it starts
// (they inherit its environment).
const envStepTimeout = "BATON_SAGA_STEP_TIMEOUT"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if len(os.Args) > 1 && os.Args[1] == chaos.WorkerCommand {
		// The harness runs this binary as each worker process.
		err = chaos.RunWorker(ctx, os.Args[2:], newSaga())
	} else {
		err = run(ctx, os.Args[1:], os.Stdout)
	}
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case errors.Is(err, chaos.ErrUsage):
		fmt.Fprintln(os.Stderr, "saga:", err)
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "saga:", err)
		os.Exit(1)
	}
}

// newSaga is the saga as this process runs it; the step timeout comes from the environment the
// harness's process set.
func newSaga() *Saga {
	s := &Saga{}
	if d, err := time.ParseDuration(os.Getenv(envStepTimeout)); err == nil {
		s.StepTimeout = d
	}
	return s
}

// options are the command's flags.
type options struct {
	brokers, pgURL string
	unfenced       bool
	faults         string
	numFaults      int
	rate, workers  int
	partitions     int
	stepTimeout    time.Duration
	session        time.Duration
	settle         time.Duration
	seed           int64
	report         string
	binary         string // the worker binary; default this executable (tests set it)
}

func parseFlags(args []string, out io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("saga", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&o.brokers, "brokers", "", "Kafka seed brokers, comma-separated (default: an embedded kfake cluster)")
	fs.StringVar(&o.pgURL, "postgres", "", "PostgreSQL URL; the run gets a schema of its own (default: SQLite files in a temporary directory)")
	fs.BoolVar(&o.unfenced, "unfenced", false, "run the same services on Kafka's assignment alone (no fence, outbox or inbox): the checker should fail it")
	fs.StringVar(&o.faults, "faults", "freeze", "faults to inject, comma-separated (freeze, delay, kill, term, storm, group-delete; 'all' needs -postgres and deploy/local)")
	fs.IntVar(&o.numFaults, "n", 2, "number of faults")
	fs.IntVar(&o.rate, "rate", 20, "orders per second")
	fs.IntVar(&o.workers, "workers", 3, "worker processes, each running the orchestrator and the three services")
	fs.IntVar(&o.partitions, "partitions", 4, "partitions per topic")
	fs.DurationVar(&o.stepTimeout, "step-timeout", 4*time.Second, "how long a step may go unanswered before its timeout record fires")
	fs.DurationVar(&o.session, "session-timeout", 2*time.Second, "the workers' Kafka session timeout")
	fs.DurationVar(&o.settle, "settle", 90*time.Second, "bound for every order to finish after the last fault")
	fs.Int64Var(&o.seed, "seed", 1, "picks the faults' targets")
	fs.StringVar(&o.report, "report", "", "directory for the verdict and an SVG timeline (default: none)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return o, err
		}
		return o, fmt.Errorf("%w: %w", chaos.ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("%w: unexpected arguments %q", chaos.ErrUsage, fs.Args())
	}
	return o, nil
}

// run runs the saga under the chaos harness and prints its verdict and the walk-through of
// one order across a takeover. It fails if an invariant broke.
func run(ctx context.Context, args []string, out io.Writer) error {
	o, err := parseFlags(args, out)
	if err != nil {
		return err
	}
	res, story, err := runSaga(ctx, o, out)
	if err != nil {
		return err
	}
	fmt.Fprintln(out)
	fmt.Fprint(out, story)
	if !res.OK() {
		if o.unfenced {
			return errors.New("invariants violated (as expected without the fence)")
		}
		return errors.New("invariants violated")
	}
	if !o.unfenced && hasFreeze(res) && res.Verdict.ZombieRefused == 0 {
		return errors.New("no zombie write was refused: the freeze did not bite, so the run proved nothing")
	}
	return nil
}

func hasFreeze(res *chaos.Result) bool {
	for _, f := range res.Faults {
		if f.Kind == chaos.FaultFreeze && f.Bit {
			return true
		}
	}
	return false
}

// runSaga runs one chaos run of the saga and returns its result and walk-through.
func runSaga(ctx context.Context, o options, out io.Writer) (*chaos.Result, string, error) {
	faults, err := chaos.ParseFaults(o.faults)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %w", chaos.ErrUsage, err)
	}
	if err := os.Setenv(envStepTimeout, o.stepTimeout.String()); err != nil {
		return nil, "", err
	}
	app := &Saga{StepTimeout: o.stepTimeout}
	mode := chaos.Fenced
	if o.unfenced {
		mode = chaos.Unfenced
	}
	dir, err := os.MkdirTemp("", "baton-saga-")
	if err != nil {
		return nil, "", err
	}
	defer os.RemoveAll(dir)
	deploy := findDeploy() // broker and database restarts, when run inside the repository
	cfg := chaos.Config{
		Mode: mode, App: app, Workers: o.workers, Partitions: int32(o.partitions), Rate: o.rate,
		Faults: faults, NumFaults: o.numFaults, Seed: o.seed, Settle: o.settle,
		SessionTimeout: o.session, Progress: out, LogDir: dir, Binary: o.binary, DeployDir: deploy,
	}
	if o.brokers == "" {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(500*time.Millisecond))
		if err != nil {
			return nil, "", fmt.Errorf("embedded Kafka: %w", err)
		}
		defer c.Close()
		cfg.Brokers = c.ListenAddrs()
		fmt.Fprintf(out, "Kafka: embedded (kfake) on %s\n", strings.Join(cfg.Brokers, ","))
	} else {
		cfg.Brokers = strings.Split(o.brokers, ",")
		fmt.Fprintf(out, "Kafka: %s\n", o.brokers)
	}
	var (
		res        *chaos.Result
		db         chaos.DB
		cleanup    func()
		sqlitePath string
	)
	if o.pgURL != "" {
		fmt.Fprintln(out, "databases: PostgreSQL (a schema of the run's own)")
		res, db, cleanup, err = chaos.RunPostgres(ctx, cfg, o.pgURL)
	} else {
		path := filepath.Join(dir, "saga.db")
		sqlitePath = path
		fmt.Fprintf(out, "databases: SQLite %s (orchestrator and services), %s (the payment provider)\n", path, strings.TrimSuffix(path, ".db")+"-psp.db")
		res, db, cleanup, err = chaos.RunSQLite(ctx, cfg, path)
	}
	if cleanup != nil {
		defer cleanup()
	}
	if err != nil {
		return nil, "", err
	}
	fmt.Fprintln(out)
	chaos.WriteVerdict(out, res)
	p, closePSP, err := openPSP(ctx, chaos.AppEnv{DB: db, SQLitePath: sqlitePath})
	if err != nil {
		return res, "", err
	}
	defer closePSP()
	story, err := walkThrough(context.WithoutCancel(ctx), db, p.db, res)
	if err != nil {
		return res, "", err
	}
	if o.report != "" {
		if err := writeReport(context.WithoutCancel(ctx), o.report, res, db, story); err != nil {
			return res, story, err
		}
		fmt.Fprintf(out, "report: %s\n", o.report)
	}
	return res, story, nil
}

func writeReport(ctx context.Context, dir string, res *chaos.Result, db chaos.DB, story string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var b strings.Builder
	chaos.WriteVerdict(&b, res)
	b.WriteString("\n" + story)
	if err := os.WriteFile(filepath.Join(dir, "saga-verdict.txt"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "saga-timeline.svg"))
	if err != nil {
		return err
	}
	defer f.Close()
	return chaos.WriteTimeline(ctx, f, db, res)
}

// findDeploy finds deploy/local (the scripts that restart the broker and the database) in the
// working directory or one above it; "" if there is none.
func findDeploy() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "deploy", "local", "kafka.sh")); err == nil {
			return filepath.Join(dir, "deploy", "local")
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}
