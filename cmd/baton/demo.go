package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/batonhq/baton/internal/operator/chaos"
	"github.com/batonhq/baton/internal/operator/status"
)

// demo runs the digital-twin demo: devices (keys) send updates; three worker processes own the
// partitions and fold each device's updates into its twin under the fence; mid-run owners are
// frozen past their session timeout (-freezes), another worker takes over, and each frozen one
// wakes and tries to write: the fence refuses it. On embedded defaults it needs nothing installed: Kafka is kfake
// in this process, the store is an SQLite file. -brokers and -postgres run it on real services.
func demo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", "[flags]", `The digital-twin demo: devices send updates; three worker processes fold them into one twin
per device under the fence and send commands to devices through the fenced outbox; mid-run
owners are frozen past their session timeout, taken over, and woken: their writes are refused.
On the defaults it needs nothing installed (Kafka in this process, an SQLite file).

Without -dir it works in a new temporary directory (the SQLite file, the workers' logs, the
verdict and the report) and removes it at the end, unless -keep is given or the demo failed:
a failing run always keeps its directory, as evidence.
`, stderr)
	var (
		o    demoOptions
		dir  string
		keep bool
	)
	fs.StringVar(&dir, "dir", "", "directory for the SQLite file and the report, kept afterwards (default: a new temporary directory)")
	fs.BoolVar(&keep, "keep", false, "keep the temporary directory after a passing run (a failing run always keeps it, as evidence; a -dir directory is never removed)")
	// No default from the environment: a shell that exported the services' addresses
	// ($BATON_KAFKA_BROKERS) still gets the embedded demo; real services are asked for by flag.
	fs.StringVar(&o.brokers, "brokers", "", "real Kafka seed brokers instead of the embedded one (never read from the environment)")
	fs.StringVar(&o.pgURL, "postgres", "", "a real PostgreSQL instead of the embedded SQLite file (never read from the environment)")
	fs.IntVar(&o.devices, "devices", 60, "simulated devices (keys)")
	fs.IntVar(&o.updates, "updates", 20, "minimum updates per device")
	fs.IntVar(&o.freezes, "freezes", 2, "owners to freeze past their session timeout (0: none, and the demo fails: nothing was proven)")
	fs.Int64Var(&o.seed, "seed", 1, "random seed")
	fs.DurationVar(&o.settle, "settle", time.Minute, "how long the backlog may take to be applied after the last fault before the demo fails (a slow or loaded machine needs more)")
	fs.StringVar(&o.statusAddr, "status", "", "also serve the live status page of the demo's group on this address (e.g. 127.0.0.1:8080) while it runs")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if o.devices <= 0 || o.updates <= 0 || o.freezes < 0 || o.settle <= 0 {
		return usageError{err: fmt.Errorf("-devices, -updates and -settle must be positive and -freezes not negative, got %d, %d, %s and %d", o.devices, o.updates, o.settle, o.freezes)}
	}
	if dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		return runDemo(ctx, dir, o, stdout)
	}
	dir, err := os.MkdirTemp("", "baton-demo-")
	if err != nil {
		return err
	}
	err = runDemo(ctx, dir, o, stdout)
	return errors.Join(err, finishTempDir(stdout, dir, keep, err != nil))
}

// finishTempDir removes the demo's temporary directory, or keeps it if asked to or if the demo
// failed, and says which.
func finishTempDir(stdout io.Writer, dir string, keep, failed bool) error {
	switch {
	case failed:
		fmt.Fprintf(stdout, "kept %s (the demo failed: the SQLite file and the report are the evidence)\n", dir)
		return nil
	case keep:
		fmt.Fprintf(stdout, "kept %s (-keep)\n", dir)
		return nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove the temporary directory: %w", err)
	}
	fmt.Fprintf(stdout, "removed %s (-keep keeps it)\n", dir)
	return nil
}

// demoOptions are the demo's settings from its flags.
type demoOptions struct {
	brokers, pgURL            string
	statusAddr                string // serve the live status page here ("" none)
	devices, updates, freezes int
	seed                      int64
	settle                    time.Duration
}

// runDemo runs the demo with its SQLite file and report in dir. Everything it started (Kafka,
// workers, the database) is stopped and closed when it returns.
func runDemo(ctx context.Context, dir string, o demoOptions, stdout io.Writer) error {
	cfg := chaos.Config{
		Mode: chaos.Fenced, Workers: 3, Partitions: 6,
		Workload: chaos.Workload{Keys: o.devices, PerKey: o.updates, CommandEvery: 4},
		Rate:     400, NumFaults: o.freezes, Seed: o.seed,
		Settle: o.settle, SessionTimeout: 3 * time.Second, Progress: stdout, LogDir: dir,
	}
	if o.freezes > 0 {
		cfg.Faults = []chaos.FaultKind{chaos.FaultFreeze}
	}
	fmt.Fprintln(stdout, "Baton demo: a digital twin per device, one writer per device, commands to devices through")
	fmt.Fprintln(stdout, "a fenced outbox, and a zombie that cannot write.")
	if o.brokers == "" {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second))
		if err != nil {
			return fmt.Errorf("embedded Kafka: %w", err)
		}
		defer c.Close()
		cfg.Brokers = c.ListenAddrs()
		fmt.Fprintf(stdout, "Kafka: embedded (kfake) on %s\n", strings.Join(cfg.Brokers, ","))
	} else {
		cfg.Brokers = strings.Split(o.brokers, ",")
		fmt.Fprintf(stdout, "Kafka: %s\n", o.brokers)
	}

	var (
		res *chaos.Result
		db  chaos.DB
		err error
	)
	// The live view runs while the harness does; it stops before the database closes.
	done := make(chan struct{})
	var wg sync.WaitGroup
	stopWatch := sync.OnceFunc(func() { close(done); wg.Wait() })
	defer stopWatch()
	cfg.Watch = func(db chaos.DB) {
		wg.Add(1)
		go func() { defer wg.Done(); showOwners(ctx, stdout, db, done) }()
	}
	// Named here (the harness would pick unique names too) so the status page can find them.
	suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
	cfg.Group, cfg.Topic = "baton-demo-"+suffix, "baton-demo-"+suffix
	store := o.pgURL
	if store == "" {
		store = filepath.Join(dir, "twins.db")
	}
	if o.statusAddr != "" {
		stopPage, err := demoStatusPage(ctx, o.statusAddr, cfg.Brokers, store, cfg.Group, cfg.Topic, stdout)
		if err != nil {
			return err
		}
		defer stopPage()
	}
	var cleanup func()
	if o.pgURL != "" {
		fmt.Fprintln(stdout, "store: PostgreSQL")
		res, db, cleanup, err = chaos.RunPostgres(ctx, cfg, o.pgURL)
	} else {
		fmt.Fprintf(stdout, "store: SQLite %s\n", store)
		res, db, cleanup, err = chaos.RunSQLite(ctx, cfg, store)
	}
	stopWatch()
	if cleanup != nil {
		defer cleanup()
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	fmt.Fprintln(stdout, "What happened: each frozen owner held a batch it was about to write; Kafka gave its")
	fmt.Fprintln(stdout, "partitions to another worker under a higher token; when the frozen one woke it tried")
	fmt.Fprintln(stdout, "to write with its old token, and the database refused it in the same transaction.")
	if err := writeReport(ctx, stdout, filepath.Join(dir, "report"), res, db); err != nil {
		return err
	}
	if !res.OK() {
		return fmt.Errorf("invariants violated")
	}
	if res.Verdict.ZombieRefused == 0 {
		return fmt.Errorf("no zombie write was refused: the fault did not bite, so the demo proved nothing")
	}
	return nil
}

// demoStatusPage serves the live status page of the demo's group on addr until the returned
// stop is called. Until the harness created the store, the page says it cannot read it yet.
func demoStatusPage(ctx context.Context, addr string, brokers []string, store, group, topic string, stdout io.Writer) (stop func(), err error) {
	c, err := status.NewCollector(status.Config{Brokers: brokers, Store: store, Group: group, Topics: []string{topic}})
	if err != nil {
		return nil, err
	}
	page, err := status.NewPage(c, status.Interval(time.Second), status.Window(5*time.Minute))
	if err != nil {
		c.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		errc <- page.ListenAndServe(ctx, addr, func(a string) {
			fmt.Fprintf(stdout, "status page: http://%s/ (live while the demo runs)\n", a)
			close(ready)
		})
	}()
	select {
	case <-ready:
	case err := <-errc:
		cancel()
		c.Close()
		return nil, err
	}
	return func() { cancel(); <-errc; c.Close() }, nil
}

// showOwners prints, every few seconds, each partition's current owner and token as the
// database records them, and the apply rate.
func showOwners(ctx context.Context, stdout io.Writer, db chaos.DB, done <-chan struct{}) {
	t := time.NewTicker(3 * time.Second)
	defer t.Stop()
	var lastN int64
	last := time.Now()
	for {
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		o, err := chaos.ReadOwnership(ctx, db)
		if err != nil {
			continue
		}
		now := time.Now()
		rate := float64(o.Applied-lastN) / now.Sub(last).Seconds()
		lastN, last = o.Applied, now
		var b strings.Builder
		for _, p := range slices.Sorted(maps.Keys(o.Owners)) {
			fmt.Fprintf(&b, " p%d:%s@%s", p, o.Owners[p].Worker, o.Owners[p].Token)
		}
		fmt.Fprintf(stdout, "          owners%s | %d updates applied, %.0f/s\n", b.String(), o.Applied, rate)
	}
}
