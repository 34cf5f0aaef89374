package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/batonhq/baton/internal/chaos"
)

// demo runs the digital-twin demo: devices (keys) send updates; three worker processes own the
// partitions and fold each device's updates into its twin under the fence; mid-run one owner is
// frozen past its session timeout, another takes over, and the frozen one wakes and tries to
// write: the fence refuses it. On embedded defaults it needs nothing installed: Kafka is kfake
// in this process, the store is an SQLite file. -brokers and -postgres run it on real services.
func demo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", "[flags]", `The digital-twin demo: devices send updates; three worker processes fold them into one twin
per device under the fence and send commands to devices through the fenced outbox; mid-run
owners are frozen past their session timeout, taken over, and woken: their writes are refused.
On the defaults it needs nothing installed (Kafka in this process, an SQLite file).
`, stderr)
	var (
		dir, brokers, pgURL string
		devices, updates    int
		freezes             int
		seed                int64
	)
	fs.StringVar(&dir, "dir", "", "directory for the SQLite file and the report (default: a new temporary directory)")
	fs.StringVar(&brokers, "brokers", os.Getenv("BATON_DEMO_BROKERS"), "real Kafka seed brokers instead of the embedded one")
	fs.StringVar(&pgURL, "postgres", os.Getenv("BATON_DEMO_POSTGRES"), "a real PostgreSQL instead of the embedded SQLite file")
	fs.IntVar(&devices, "devices", 60, "simulated devices (keys)")
	fs.IntVar(&updates, "updates", 20, "minimum updates per device")
	fs.IntVar(&freezes, "freezes", 2, "owners to freeze past their session timeout")
	fs.Int64Var(&seed, "seed", 1, "random seed")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if dir == "" {
		d, err := os.MkdirTemp("", "baton-demo-")
		if err != nil {
			return err
		}
		dir = d
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	cfg := chaos.Config{
		Mode: chaos.Fenced, Workers: 3, Partitions: 6,
		Workload: chaos.Workload{Keys: devices, PerKey: updates, CommandEvery: 4},
		Rate:     400, Faults: []chaos.FaultKind{chaos.FaultFreeze}, NumFaults: freezes, Seed: seed,
		Settle: 60 * time.Second, SessionTimeout: 3 * time.Second, Progress: stdout,
	}
	fmt.Fprintln(stdout, "Baton demo: a digital twin per device, one writer per device, commands to devices through")
	fmt.Fprintln(stdout, "a fenced outbox, and a zombie that cannot write.")
	if brokers == "" {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second))
		if err != nil {
			return fmt.Errorf("embedded Kafka: %w", err)
		}
		defer c.Close()
		cfg.Brokers = c.ListenAddrs()
		fmt.Fprintf(stdout, "Kafka: embedded (kfake) on %s\n", strings.Join(cfg.Brokers, ","))
	} else {
		cfg.Brokers = strings.Split(brokers, ",")
		fmt.Fprintf(stdout, "Kafka: %s\n", brokers)
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
	var cleanup func()
	if pgURL != "" {
		fmt.Fprintln(stdout, "store: PostgreSQL")
		res, db, cleanup, err = chaos.RunPostgres(ctx, cfg, pgURL)
	} else {
		path := filepath.Join(dir, "twins.db")
		fmt.Fprintf(stdout, "store: SQLite %s\n", path)
		res, db, cleanup, err = chaos.RunSQLite(ctx, cfg, path)
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
