package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"
)

// errUsage marks a command line the program cannot run (exit status 2).
var errUsage = errors.New("usage")

// options are the command's flags.
type options struct {
	brokers, pgURL string
	redis          string // the twins, their fences and the commands in Redis instead of SQL
	redisLossy     bool
	serve          string // -serve ADDR: run as a member
	migrate        bool
	appRole        string
	group          string
	instanceID     string
	session        time.Duration
	prefix         string
	logFormat      string
	logLevel       string
}

// sessionOr returns the session timeout set, or def.
func (o options) sessionOr(def time.Duration) time.Duration {
	if o.session > 0 {
		return o.session
	}
	return def
}

// envFallback names, for each flag a deployment sets through the environment, the variable a
// member (-serve) or the migration (-migrate) reads when the flag is not given. The demo reads
// no environment: a shell's BATON_POSTGRES_URL never turns it into a run on real services.
// The names are the ones every Baton program reads (the baton command, deploy/local's env.sh).
var envFallback = map[string]string{
	"brokers":         "BATON_KAFKA_BROKERS",
	"postgres":        "BATON_POSTGRES_URL",
	"group":           "BATON_GROUP",
	"instance-id":     "BATON_INSTANCE_ID",
	"session-timeout": "BATON_SESSION_TIMEOUT",
	"app-role":        "BATON_APP_ROLE",
	"redis":           "BATON_REDIS_ADDR",
	"log-format":      "BATON_LOG_FORMAT",
	"log-level":       "BATON_LOG_LEVEL",
}

// renamedEnv names, for each variable an earlier release read, the one that replaces it. A
// member or migration that finds one set refuses to start rather than ignore it.
var renamedEnv = map[string]string{
	"BATON_BROKERS": "BATON_KAFKA_BROKERS",
}

const usageHead = `usage: twin [-brokers B] [-postgres URL | -redis ADDR]   the demo (default: embedded Kafka and SQLite)
       twin -serve ADDR [flags]                          one member of the twins group (consumer and relay)
       twin -migrate [-app-role R] [flags]               create the tables in PostgreSQL, grant the runtime role

With -serve or -migrate, a flag not given is read from the environment variable named in its
description ($NAME); the demo reads no environment.

`

func newFlagSet(o *options, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("twin", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageHead)
		fs.PrintDefaults()
	}
	fs.StringVar(&o.brokers, "brokers", "", "Kafka seed brokers, comma-separated (demo default: an embedded kfake cluster; $BATON_KAFKA_BROKERS)")
	fs.StringVar(&o.pgURL, "postgres", "", "PostgreSQL URL (demo default: SQLite files in a temporary directory; the demo makes a schema of its own; $BATON_POSTGRES_URL)")
	fs.StringVar(&o.redis, "redis", "", "Redis at `ADDR` (host:port) instead of SQL: the twins in hashes, each device's commands in a stream of its own and the fences (fence/redisfence), one fenced script per batch; no outbox, no gateway ($BATON_REDIS_ADDR)")
	fs.BoolVar(&o.redisLossy, "redis-allow-loss", false, "with -redis: accept a server that can lose acknowledged writes (anything but appendonly yes, appendfsync always), such as deploy/local's")
	fs.StringVar(&o.serve, "serve", "", "run as one long-running member of the twins group (consumer and outbox relay, no devices, no gateway), serving /metrics, /healthz and /readyz on `ADDR` (e.g. :8080)")
	fs.BoolVar(&o.migrate, "migrate", false, "create the program's tables in -postgres (fences, recoveries, keyed inbox, outbox, twins, applied) and grant -app-role its runtime rights, then exit")
	fs.StringVar(&o.appRole, "app-role", "", "with -migrate: the least-privilege runtime role to grant (none if empty; $BATON_APP_ROLE)")
	fs.StringVar(&o.group, "group", "", "with -serve: the consumer group (default twins; $BATON_GROUP)")
	fs.StringVar(&o.instanceID, "instance-id", "", "with -serve: the member's group.instance.id, for static membership (none if empty; $BATON_INSTANCE_ID)")
	fs.DurationVar(&o.session, "session-timeout", 0, "Kafka session timeout (default: 1s in the demo, franz-go's 45s with -serve; $BATON_SESSION_TIMEOUT)")
	fs.StringVar(&o.logFormat, "log-format", "text", "with -serve or -migrate: the log's format, text or json ($BATON_LOG_FORMAT)")
	fs.StringVar(&o.logLevel, "log-level", "info", "with -serve or -migrate: the lowest level logged: debug, info, warn or error ($BATON_LOG_LEVEL)")
	fs.StringVar(&o.prefix, "prefix", "", "with -serve: a prefix of the topics' names (device-updates, device-updates.dlq, device-commands)")
	return fs
}

func parseFlags(args []string, out io.Writer) (options, error) {
	var o options
	fs := newFlagSet(&o, out)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return o, err
		}
		return o, fmt.Errorf("%w: %w", errUsage, err)
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	if o.session < 0 {
		return o, fmt.Errorf("%w: -session-timeout %s is negative", errUsage, o.session)
	}
	if o.serve != "" && o.migrate {
		return o, fmt.Errorf("%w: -serve and -migrate are two programs: give one", errUsage)
	}
	if o.serve == "" && !o.migrate {
		var member []string
		for _, name := range []string{"app-role", "group", "instance-id", "prefix", "log-format", "log-level"} {
			if f := fs.Lookup(name); f.Value.String() != f.DefValue {
				member = append(member, "-"+name)
			}
		}
		if len(member) > 0 {
			return o, fmt.Errorf("%w: %v apply to -serve or -migrate only", errUsage, member)
		}
		switch {
		case o.pgURL != "" && o.redis != "":
			return o, fmt.Errorf("%w: -postgres and -redis are two stores: give one", errUsage)
		case o.redisLossy && o.redis == "":
			return o, fmt.Errorf("%w: -redis-allow-loss applies to -redis only", errUsage)
		}
		return o, nil
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs []error
	for old, now := range renamedEnv {
		if os.Getenv(old) != "" {
			errs = append(errs, fmt.Errorf("$%s is no longer read: use $%s", old, now))
		}
	}
	for name, env := range envFallback {
		// A store named on the command line is the store: the other's variable is not read.
		// -migrate creates PostgreSQL's tables; Redis has none.
		if (name == "postgres" || name == "redis") && (set["postgres"] || set["redis"]) || name == "redis" && o.migrate {
			continue
		}
		if v := os.Getenv(env); v != "" && !set[name] {
			if err := fs.Set(name, v); err != nil {
				errs = append(errs, fmt.Errorf("$%s: %w", env, err))
			}
		}
	}
	switch {
	case o.migrate && o.redis != "":
		errs = append(errs, errors.New("-migrate creates PostgreSQL's tables: a member on -redis needs none"))
	case o.pgURL != "" && o.redis != "":
		errs = append(errs, errors.New("two stores (-postgres or $BATON_POSTGRES_URL, -redis or $BATON_REDIS_ADDR): give one"))
	case o.migrate && o.pgURL == "":
		errs = append(errs, errors.New("no PostgreSQL URL (-postgres or $BATON_POSTGRES_URL)"))
	case o.pgURL == "" && o.redis == "":
		errs = append(errs, errors.New("no PostgreSQL URL or Redis address (-postgres or $BATON_POSTGRES_URL, -redis or $BATON_REDIS_ADDR)"))
	}
	if o.redisLossy && o.redis == "" {
		errs = append(errs, errors.New("-redis-allow-loss applies to -redis only"))
	}
	if o.serve != "" && o.brokers == "" {
		errs = append(errs, errors.New("no Kafka brokers (-brokers or $BATON_KAFKA_BROKERS)"))
	}
	if o.session < 0 {
		errs = append(errs, fmt.Errorf("session timeout %s is negative", o.session))
	}
	if o.group == "" {
		o.group = "twins"
	}
	if _, err := newLogger(io.Discard, o.logFormat, o.logLevel); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return o, fmt.Errorf("%w: %w", errUsage, err)
	}
	return o, nil
}
