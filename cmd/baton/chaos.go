package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/chaos"
	"github.com/batonhq/baton/outbox/pgoutbox"
)

func chaosCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	var (
		cfg                      chaos.Config
		mode, faults, brokers    string
		pgURL, report, deployDir string
		keys, perKey             int
		partitions               int
	)
	fs.StringVar(&mode, "mode", "fenced", "fenced (Baton), unfenced (Kafka assignment alone) or lock (the seeds' Redis lease)")
	fs.IntVar(&cfg.Workers, "workers", 3, "worker processes")
	fs.IntVar(&partitions, "partitions", 12, "topic partitions")
	fs.IntVar(&keys, "keys", 200, "distinct keys")
	fs.IntVar(&perKey, "per-key", 100, "records per key")
	fs.IntVar(&cfg.Rate, "rate", 500, "records produced per second")
	fs.IntVar(&cfg.Workload.CommandEvery, "command-every", 4, "fenced mode: send a device command through the outbox for every Nth update (0: none)")
	fs.StringVar(&faults, "faults", "all", "fault kinds, comma-separated: "+kinds())
	fs.IntVar(&cfg.NumFaults, "num-faults", 0, "faults to inject (default: 3 per kind)")
	fs.Int64Var(&cfg.Seed, "seed", 1, "random seed for targets and order")
	fs.DurationVar(&cfg.Settle, "settle", 90*time.Second, "bound for applying the backlog after the last fault")
	fs.DurationVar(&cfg.SessionTimeout, "session-timeout", 3*time.Second, "workers' Kafka session timeout")
	fs.StringVar(&brokers, "brokers", os.Getenv("BATON_KAFKA_BROKERS"), "Kafka seed brokers (default $BATON_KAFKA_BROKERS)")
	fs.StringVar(&pgURL, "postgres", os.Getenv("BATON_POSTGRES_URL"), "PostgreSQL URL (default $BATON_POSTGRES_URL)")
	fs.StringVar(&cfg.RedisAddr, "redis", os.Getenv("BATON_REDIS_ADDR"), "Redis address for -mode lock (default $BATON_REDIS_ADDR)")
	fs.StringVar(&deployDir, "deploy", "deploy/local", "directory of kafka.sh and postgres.sh, for restart faults")
	fs.StringVar(&report, "report", "chaos-report", "directory for the verdict and timeline")
	if err := fs.Parse(args); err != nil {
		return err
	}
	m, err := chaos.ParseMode(mode)
	if err != nil {
		return err
	}
	cfg.Mode = m
	if cfg.Faults, err = chaos.ParseFaults(faults); err != nil {
		return err
	}
	cfg.Partitions = int32(partitions)
	cfg.Workload.Keys, cfg.Workload.PerKey = keys, perKey
	if brokers == "" || pgURL == "" {
		return errors.New("needs -brokers and -postgres (or BATON_KAFKA_BROKERS and BATON_POSTGRES_URL); 'make up' starts both")
	}
	if m == chaos.Lock && cfg.RedisAddr == "" {
		return errors.New("-mode lock needs -redis (or BATON_REDIS_ADDR)")
	}
	cfg.Brokers = strings.Split(brokers, ",")
	if cfg.DeployDir, err = filepath.Abs(deployDir); err != nil {
		return err
	}
	cfg.Progress = os.Stdout

	res, db, cleanup, err := RunChaosPostgres(ctx, cfg, pgURL)
	if cleanup != nil {
		defer cleanup()
	}
	if err != nil {
		return err
	}
	if err := writeReport(ctx, report, res, db); err != nil {
		return err
	}
	if !res.OK() {
		return fmt.Errorf("invariants violated (see %s)", report)
	}
	return nil
}

func kinds() string {
	var s []string
	for _, k := range chaos.AllFaults {
		s = append(s, string(k))
	}
	return strings.Join(s, ",")
}

// RunChaosPostgres runs cfg against PostgreSQL in a fresh schema of its own.
func RunChaosPostgres(ctx context.Context, cfg chaos.Config, pgURL string) (*chaos.Result, chaos.DB, func(), error) {
	schema := fmt.Sprintf("chaos_%s_%d", cfg.Mode, time.Now().UnixNano())
	admin, err := pgx.Connect(ctx, pgURL)
	if err != nil {
		return nil, nil, nil, err
	}
	_, err = admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	admin.Close(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	sep := "?"
	if strings.Contains(pgURL, "?") {
		sep = "&"
	}
	cfg.PostgresURL = pgURL + sep + "search_path=" + schema
	pool, err := pgxpool.New(ctx, cfg.PostgresURL)
	if err != nil {
		return nil, nil, nil, err
	}
	db := chaos.PgDB(pool)
	store, err := PreparePostgres(ctx, pool)
	if err != nil {
		pool.Close()
		return nil, nil, nil, err
	}
	cfg.Receiver = func(ctx context.Context, brokers []string, group, topic string) error {
		return chaos.RunReceiver[pgx.Tx](ctx, brokers, group, topic, store, store, chaos.PgTx, quietLogger())
	}
	res, err := chaos.Run(ctx, cfg, db)
	return res, db, pool.Close, err
}

// PreparePostgres creates the fence, outbox and workload tables in the pool's schema.
func PreparePostgres(ctx context.Context, pool *pgxpool.Pool) (*pgfence.Store, error) {
	store, err := pgfence.New(pool)
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil {
		return nil, err
	}
	box, err := pgoutbox.New(pool)
	if err != nil {
		return nil, err
	}
	if err := box.Migrate(ctx); err != nil {
		return nil, err
	}
	return store, chaos.Migrate(ctx, chaos.PgDB(pool))
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}

func writeReport(ctx context.Context, dir string, res *chaos.Result, db chaos.DB) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var b strings.Builder
	chaos.WriteVerdict(&b, res)
	fmt.Print("\n" + b.String())
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
	fmt.Printf("report: %s, %s\n", name, svg)
	return nil
}
