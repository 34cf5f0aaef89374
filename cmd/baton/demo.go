package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/batonhq/baton/chaos"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/outbox/sqliteoutbox"
)

// demo runs the digital-twin demo: devices (keys) send updates; three worker processes own the
// partitions and fold each device's updates into its twin under the fence; mid-run one owner is
// frozen past its session timeout, another takes over, and the frozen one wakes and tries to
// write: the fence refuses it. On embedded defaults it needs nothing installed: Kafka is kfake
// in this process, the store is an SQLite file. -brokers and -postgres run it on real services.
func demo(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
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
	if err := fs.Parse(args); err != nil {
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
		Settle: 60 * time.Second, SessionTimeout: 3 * time.Second, Progress: os.Stdout,
	}
	fmt.Println("Baton demo: a digital twin per device, one writer per device, commands to devices through")
	fmt.Println("a fenced outbox, and a zombie that cannot write.")
	if brokers == "" {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second))
		if err != nil {
			return fmt.Errorf("embedded Kafka: %w", err)
		}
		defer c.Close()
		cfg.Brokers = c.ListenAddrs()
		fmt.Printf("Kafka: embedded (kfake) on %s\n", strings.Join(cfg.Brokers, ","))
	} else {
		cfg.Brokers = strings.Split(brokers, ",")
		fmt.Printf("Kafka: %s\n", brokers)
	}

	var (
		res *chaos.Result
		db  chaos.DB
		err error
	)
	done := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(done)
	watch := func(db chaos.DB) {
		wg.Add(1)
		go func() { defer wg.Done(); showOwners(ctx, db, cfg.Partitions, done) }()
	}
	if pgURL != "" {
		fmt.Println("store: PostgreSQL")
		cfg.Watch = watch
		var cleanup func()
		res, db, cleanup, err = RunChaosPostgres(ctx, cfg, pgURL)
		if cleanup != nil {
			defer cleanup()
		}
	} else {
		cfg.SQLitePath = filepath.Join(dir, "twins.db")
		fmt.Printf("store: SQLite %s\n", cfg.SQLitePath)
		store, oerr := sqlitefence.Open(cfg.SQLitePath)
		if oerr != nil {
			return oerr
		}
		defer store.Close()
		db = chaos.SQLDB(store.DB())
		if err := chaos.Migrate(ctx, db); err != nil {
			return err
		}
		if box, err := sqliteoutbox.New(store.DB()); err != nil {
			return err
		} else if err := box.Migrate(ctx); err != nil { // creates the outbox tables
			return err
		}
		cfg.Receiver = func(ctx context.Context, brokers []string, group, topic string) error {
			return chaos.RunReceiver[*sql.Tx](ctx, brokers, group, topic, store, store, chaos.SQLTx, quietLogger())
		}
		watch(db)
		res, err = chaos.Run(ctx, cfg, db)
	}
	if err != nil {
		return err
	}
	fmt.Println()
	fmt.Println("What happened: each frozen owner held a batch it was about to write; Kafka gave its")
	fmt.Println("partitions to another worker under a higher token; when the frozen one woke it tried")
	fmt.Println("to write with its old token, and the database refused it in the same transaction.")
	if err := writeReport(ctx, filepath.Join(dir, "report"), res, db); err != nil {
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
func showOwners(ctx context.Context, db chaos.DB, parts int32, done <-chan struct{}) {
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
		type owner struct{ worker, token string }
		owners := map[int32]owner{}
		rows, err := db.Query(ctx, `SELECT a.part, a.worker, a.era, a.epoch FROM chaos_applied a
JOIN (SELECT part, max(id) AS id FROM chaos_applied GROUP BY part) m ON a.id = m.id`)
		if err != nil {
			continue
		}
		for rows.Next() {
			var p int32
			var w string
			var era, epoch int64
			if rows.Scan(&p, &w, &era, &epoch) == nil {
				owners[p] = owner{w, fmt.Sprintf("%d.%d", era, epoch)}
			}
		}
		rows.Close()
		var n int64
		_ = db.QueryRow(ctx, `SELECT coalesce(sum(n), 0) FROM chaos_state`).Scan(&n)
		now := time.Now()
		rate := float64(n-lastN) / now.Sub(last).Seconds()
		lastN, last = n, now
		var b strings.Builder
		ps := make([]int, 0, len(owners))
		for p := range owners {
			ps = append(ps, int(p))
		}
		sort.Ints(ps)
		for _, p := range ps {
			o := owners[int32(p)]
			fmt.Fprintf(&b, " p%d:%s@%s", p, o.worker, o.token)
		}
		fmt.Printf("          owners%s | %d updates applied, %.0f/s\n", b.String(), n, rate)
	}
}
