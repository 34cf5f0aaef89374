package chaos

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/internal/secure"
	"github.com/batonhq/baton/outbox/pgoutbox"
	"github.com/batonhq/baton/outbox/sqliteoutbox"
)

// The worker process's command line is a contract between the harness, which builds it
// (workerArgs.argv), and the worker, which parses it (workerArgs.flags): both live in this file
// so they cannot drift, and TestWorkerArgvRoundTrip proves one parses back what the other built.

// WorkerCommand is the command name under which Config.Binary runs a worker: the harness
// starts 'Binary WorkerCommand -flag value...', and that program hands the flags to RunWorker.
const WorkerCommand = "worker"

// workerArgs is everything the harness tells a worker process.
type workerArgs struct {
	ID             string
	Mode           Mode
	Brokers        []string
	Group, Topic   string
	SessionTimeout time.Duration
	PostgresURL    string // exactly one of PostgresURL and SQLitePath
	SQLitePath     string
	RedisAddr      string   // lock mode
	RedisSink      string   // the built-in workload, fenced, written to this Redis (redis_sink.go)
	CommandEvery   int      // the built-in workload, fenced: a command through the outbox every this many records (0: none)
	App            string   // the application the worker runs ("" for the built-in workload)
	InstanceID     string   // static membership: the worker's group.instance.id ("" for a dynamic member)
	CommandTopics  int      // the built-in workload: destination topics its commands are routed to (1 or 2)
	ShardURLs      []string // the built-in workload, fenced, written through a sharded sink over these databases, home first (sharded.go)
}

// flags defines the worker's flags on fs, parsed into a.
func (a *workerArgs) flags(fs *flag.FlagSet) {
	fs.StringVar(&a.ID, "id", "", "worker id")
	fs.Func("mode", "fenced, unfenced or lock (default fenced)", func(s string) error {
		m, err := ParseMode(s)
		a.Mode = m
		return err
	})
	fs.Func("brokers", "Kafka seed brokers, comma-separated", func(s string) error {
		a.Brokers = strings.Split(s, ",")
		return nil
	})
	fs.StringVar(&a.Group, "group", "", "consumer group")
	fs.StringVar(&a.Topic, "topic", "", "topic")
	fs.StringVar(&a.PostgresURL, "postgres", "", "PostgreSQL URL")
	fs.StringVar(&a.SQLitePath, "sqlite", "", "SQLite file")
	fs.StringVar(&a.RedisAddr, "redis", "", "Redis address (lock mode)")
	fs.StringVar(&a.RedisSink, "redis-sink", "", "the built-in workload, fenced: write through this Redis (fence/redisfence); the database keeps the run's logs")
	fs.DurationVar(&a.SessionTimeout, "session-timeout", 3*time.Second, "Kafka session timeout")
	fs.IntVar(&a.CommandEvery, "command-every", 0, "send a command for every record whose sequence is a multiple of this")
	fs.StringVar(&a.App, "app", "", "the application to run (one given to RunWorker; empty for the built-in workload)")
	fs.StringVar(&a.InstanceID, "instance-id", "", "static group membership: the group.instance.id (empty: a dynamic member)")
	fs.Func("shard", "the built-in workload, fenced: a PostgreSQL database of the sharded sink it writes through (repeated, home first); -postgres keeps the run's logs", func(s string) error {
		a.ShardURLs = append(a.ShardURLs, s)
		return nil
	})
	fs.IntVar(&a.CommandTopics, "command-topics", 0, "the built-in workload: route commands to 2 destination topics (0 or 1: one), read by one receiver with one inbox")
}

// argv is the worker's command line for a, after WorkerCommand.
func (a workerArgs) argv() []string {
	args := []string{"-id", a.ID, "-mode", string(a.Mode), "-brokers", strings.Join(a.Brokers, ","),
		"-group", a.Group, "-topic", a.Topic, "-session-timeout", a.SessionTimeout.String()}
	if a.PostgresURL != "" {
		args = append(args, "-postgres", a.PostgresURL)
	}
	if a.SQLitePath != "" {
		args = append(args, "-sqlite", a.SQLitePath)
	}
	if a.RedisAddr != "" {
		args = append(args, "-redis", a.RedisAddr)
	}
	if a.RedisSink != "" {
		args = append(args, "-redis-sink", a.RedisSink)
	}
	if a.CommandEvery > 0 {
		args = append(args, "-command-every", strconv.Itoa(a.CommandEvery))
	}
	if a.App != "" {
		args = append(args, "-app", a.App)
	}
	if a.InstanceID != "" {
		args = append(args, "-instance-id", a.InstanceID)
	}
	if a.CommandTopics > 1 {
		args = append(args, "-command-topics", strconv.Itoa(a.CommandTopics))
	}
	for _, u := range a.ShardURLs {
		args = append(args, "-shard", u)
	}
	return args
}

// parseWorkerArgs parses a worker's command line (without WorkerCommand), printing flag errors
// and usage to out. It returns flag.ErrHelp for -h, and errors wrapping ErrUsage otherwise.
func parseWorkerArgs(args []string, out io.Writer) (workerArgs, error) {
	a := workerArgs{Mode: Fenced}
	fs := flag.NewFlagSet(WorkerCommand, flag.ContinueOnError)
	fs.SetOutput(out)
	a.flags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return a, err
		}
		return a, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return a, fmt.Errorf("%w: unexpected arguments %q", ErrUsage, fs.Args())
	}
	if (a.PostgresURL == "") == (a.SQLitePath == "") {
		return a, fmt.Errorf("%w: give exactly one of -postgres and -sqlite", ErrUsage)
	}
	return a, nil
}

// RunWorker runs one worker process, as the harness started it: args are the flags after
// WorkerCommand; apps are the applications this binary can run (the harness names one with
// -app, for a run whose Config.App it is). It returns nil when ctx ends (the harness sends
// SIGTERM); flag.ErrHelp after printing the flags to stderr for -h; and an error wrapping
// ErrUsage for a command line it cannot run (the flag package prints its own errors with the
// flags).
func RunWorker(ctx context.Context, args []string, apps ...App) error {
	a, err := parseWorkerArgs(args, os.Stderr)
	if err != nil {
		return err
	}
	var app App = newBuiltin(Workload{CommandEvery: a.CommandEvery, CommandTopics: a.CommandTopics}, a.Mode)
	if a.App != "" {
		if app, err = appByName(a.App, apps); err != nil {
			return err
		}
		if a.Mode == Lock {
			return fmt.Errorf("%w: an application runs fenced or unfenced", ErrUsage)
		}
	}
	cfg := WorkerConfig{
		ID: a.ID, Mode: a.Mode, Brokers: a.Brokers, Group: a.Group, Topic: a.Topic,
		SessionTimeout: a.SessionTimeout, RedisAddr: a.RedisAddr, InstanceID: a.InstanceID,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("worker", a.ID),
	}
	if k := secure.FromEnv(WorkerKafkaEnv); k.Enabled() {
		if cfg.Kafka, err = k.Opts(); err != nil {
			return err
		}
	}
	// In a network namespace (netns.go), the host's loopback services are at netHost.
	netHost := os.Getenv(NetHostEnv)
	if netHost != "" {
		cfg.Kafka = append(cfg.Kafka, kgo.Dialer(loopbackDialer(netHost)))
		cfg.RedisAddr, a.RedisSink = mapLoopback(netHost, cfg.RedisAddr), mapLoopback(netHost, a.RedisSink)
	}
	if a.SQLitePath != "" {
		store, err := sqlitefence.Open(a.SQLitePath)
		if err != nil {
			return err
		}
		defer store.Close()
		db := SQLDB(store.DB())
		env := AppEnv{Mode: cfg.Mode, DB: db, SQLitePath: a.SQLitePath, Worker: cfg.ID, base: cfg.Topic}
		if a.RedisSink != "" {
			return runRedisSink(ctx, cfg, env, a.RedisSink)
		}
		if a.App == "" && cfg.Mode != Fenced {
			return RunBaseline(ctx, cfg, db) // the built-in workload's baselines
		}
		if cfg.Mode != Fenced {
			return runUnfencedApp(ctx, cfg, app, env)
		}
		box, err := sqliteoutbox.New(store)
		if err == nil {
			err = box.Migrate(ctx)
		}
		if err != nil {
			return err
		}
		return runFencedApp[*sql.Tx](ctx, cfg, app, env, store, store, SQLTx, box)
	}
	pcfg, err := pgxpool.ParseConfig(a.PostgresURL)
	if err != nil {
		return err
	}
	// A transaction held open by a frozen process keeps the fence row locked and so blocks the
	// takeover; the database ends it after this long (DESIGN.md).
	timeout := cfg.SessionTimeout
	if timeout <= 0 {
		timeout = 3 * time.Second
	}
	if netHost != "" {
		pcfg.ConnConfig.DialFunc = loopbackDialer(netHost)
	}
	pcfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = strconv.FormatInt((2 * timeout).Milliseconds(), 10)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	db := PgDB(pool)
	// An application's own connections reach the database as the worker's do (netHost).
	env := AppEnv{Mode: cfg.Mode, DB: db, PostgresURL: mapLoopbackURL(netHost, a.PostgresURL), Worker: cfg.ID, base: cfg.Topic}
	if a.RedisSink != "" {
		return runRedisSink(ctx, cfg, env, a.RedisSink)
	}
	if len(a.ShardURLs) > 0 {
		return runShardedWorker(ctx, cfg, env, a.ShardURLs)
	}
	if a.App == "" && cfg.Mode != Fenced {
		return RunBaseline(ctx, cfg, db) // the built-in workload's baselines
	}
	if cfg.Mode != Fenced {
		return runUnfencedApp(ctx, cfg, app, env)
	}
	store, err := pgfence.New(pool)
	if err != nil {
		return err
	}
	box, err := pgoutbox.New(pool, store) // tables created by whoever started the run
	if err != nil {
		return err
	}
	return runFencedApp[pgx.Tx](ctx, cfg, app, env, store, store, PgTx, box)
}
