package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/operator/status"
	"github.com/batonhq/baton/internal/operator/telemetry"
)

// The operator's commands: status (and its live page), who-owns, eras, recover, schema,
// migrate. The logic is in internal/operator/status; these functions parse flags and print.

// sourceFlags are the flags saying where a group's state lives.
type sourceFlags struct {
	fs                           *flag.FlagSet
	brokers, store, group, topic string
	shards                       string
	fenceTable, outboxTable      string
	logFormat, logLevel          string
	timeout                      time.Duration
	json                         bool
}

func (s *sourceFlags) register(fs *flag.FlagSet, withJSON bool) {
	s.fs = fs
	fs.StringVar(&s.brokers, "brokers", os.Getenv(envBrokers), "Kafka seed brokers, comma separated (default $"+envBrokers+")")
	fs.StringVar(&s.store, "store", os.Getenv(envPostgres), "the fence store: a PostgreSQL URL (postgres://...) or an SQLite file path (default $"+envPostgres+")")
	registerShards(fs, &s.shards)
	fs.StringVar(&s.group, "group", os.Getenv(envGroup), "the consumer group (required; default $"+envGroup+")")
	fs.StringVar(&s.topic, "topic", "", "only this topic (default: every topic the group has state for)")
	fs.StringVar(&s.fenceTable, "fence-table", "", "the fence table (default baton_fences; recoveries and keyed tables derive from it)")
	fs.StringVar(&s.outboxTable, "outbox-table", "", "the outbox table (default baton_outbox; its cursors table derives from it)")
	fs.StringVar(&s.logFormat, "log-format", os.Getenv(envLogFormat), "the log's format: text or json (default $"+envLogFormat+", else text)")
	fs.StringVar(&s.logLevel, "log-level", os.Getenv(envLogLevel), "the lowest level logged: debug, info, warn or error (default $"+envLogLevel+", else info)")
	fs.DurationVar(&s.timeout, "timeout", 5*time.Second, "how long to wait for each source before reporting it unreachable")
	if withJSON {
		fs.BoolVar(&s.json, "json", false, "print JSON instead of text")
	}
}

// logger returns the command's logger on w, as -log-format and -log-level say.
func (s *sourceFlags) logger(w io.Writer) (*slog.Logger, error) {
	l, err := telemetry.NewLogger(w, s.logFormat, s.logLevel)
	if err != nil {
		return nil, usageError{err: err}
	}
	return l, nil
}

// registerShards registers -shards, a sharded sink's databases. Its default is read by
// shardList, not shown: the URLs may carry passwords.
func registerShards(fs *flag.FlagSet, v *string) {
	fs.StringVar(v, "shards", "", "a sharded sink's PostgreSQL databases (fence/shard), NAME=URL or URL, comma separated, home shard first: every one is read, and the placement in the home shard says where each partition lives (default $"+envShards+"; an explicit -store reads that one database instead)")
}

// shardAddrs returns the sharded sink's databases to read, home first: -shards (default
// $BATON_POSTGRES_SHARD_URLS), unless -store was given and -shards was not. Nil means one
// database, -store.
func (s *sourceFlags) shardAddrs() ([]status.ShardAddr, error) {
	set := map[string]bool{}
	s.fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["store"] && set["shards"] {
		return nil, usageError{err: errors.New("-store and -shards exclude each other: -store reads one database, -shards every shard of a sharded sink")}
	}
	if set["store"] {
		return nil, nil
	}
	list, err := shardList(s.fs, s.shards)
	if err != nil {
		return nil, err
	}
	var out []status.ShardAddr
	for _, n := range list {
		out = append(out, status.ShardAddr{Name: n.Name, Store: n.URL})
	}
	return out, nil
}

// shardList parses -shards when it was given, else $BATON_POSTGRES_SHARD_URLS.
func shardList(fs *flag.FlagSet, v string) ([]namedURL, error) {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "shards" })
	list, err := shardURLs()
	if given {
		list, err = parseShardURLs(v)
	}
	if err != nil {
		return nil, usageError{err: err}
	}
	return list, nil
}

// stores returns the databases to read, as shards: the sharded sink's, or the one of -store
// as one shard named "".
func (s *sourceFlags) stores() ([]status.ShardAddr, error) {
	shards, err := s.shardAddrs()
	if err != nil || shards != nil {
		return shards, err
	}
	if s.store == "" {
		return nil, usageError{err: fmt.Errorf("no store given: pass -store (default $%s) or -shards (default $%s)", envPostgres, envShards)}
	}
	return []status.ShardAddr{{Store: s.store}}, nil
}

func (s *sourceFlags) tables() status.Tables {
	return status.Tables{Fence: s.fenceTable, Outbox: s.outboxTable}
}

func (s *sourceFlags) collector() (*status.Collector, error) {
	if _, err := s.logger(io.Discard); err != nil {
		return nil, err
	}
	shards, err := s.shardAddrs()
	if err != nil {
		return nil, err
	}
	cfg := status.Config{Store: s.store, Shards: shards, Group: s.group, Tables: s.tables(), Timeout: s.timeout}
	if s.brokers != "" {
		cfg.Brokers = strings.Split(s.brokers, ",")
	}
	if s.topic != "" {
		cfg.Topics = []string{s.topic}
	}
	c, err := status.NewCollector(cfg)
	return c, asUsage(err)
}

// asUsage turns a request that could not run into a usageError (exit status 2).
func asUsage(err error) error {
	if err != nil && errors.Is(err, status.ErrUsage) {
		return usageError{err: err}
	}
	return err
}

func statusCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("status", "-group G [-brokers B] [-store S] [flags]", `One line per partition of a consumer group: the owning member (client id or instance id, and
host), the fence's token and position, Kafka's committed offset and high watermark, the lag
(high watermark - (position+1)), the outbox backlog and the last recovery; then a summary.
A source that cannot be reached is named, the other one is still shown, and the exit status
is 1. With -http it serves a live page instead (HTML refreshing itself, /status.json,
/timeline.svg, /metrics) until interrupted.

A sharded sink (-shards, default $`+envShards+`):
every shard is read, and each partition is shown once, from the shard the placement (stored in
the home shard) puts it on, with a SHARD column; a fence a move retired on another shard is
listed as moved, never as a second owner. A shard that cannot be reached is named, the others
are shown, and the exit status is 1.
`, stderr)
	var s sourceFlags
	s.register(fs, true)
	addr := fs.String("http", "", "serve the live status page on this address (e.g. 127.0.0.1:8080) instead of printing once")
	interval := fs.Duration("interval", 2*time.Second, "with -http: how often the page reads the sources and refreshes")
	window := fs.Duration("window", 10*time.Minute, "with -http: how far back the charts and the timeline reach")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	c, err := s.collector()
	if err != nil {
		return err
	}
	defer c.Close()
	if *addr != "" {
		return servePage(ctx, c, *addr, *interval, *window, stdout)
	}
	snap, err := c.Collect(ctx)
	if s.json {
		if werr := status.WriteJSON(stdout, snap); werr != nil {
			return werr
		}
	} else if werr := status.WriteText(stdout, snap); werr != nil {
		return werr
	}
	return err
}

// servePage serves the live status page with its /metrics until ctx ends.
func servePage(ctx context.Context, c *status.Collector, addr string, interval, window time.Duration, stdout io.Writer) error {
	m, err := telemetry.New(ctx, telemetry.ServiceName("baton-status"), telemetry.OTLPFromEnv())
	if err != nil {
		return err
	}
	defer func() { _ = m.Shutdown(context.Background()) }()
	page, err := status.NewPage(c, status.Interval(interval), status.Window(window),
		status.Metrics(m.Handler()), status.MeterProvider(m.Provider()))
	if err != nil {
		return asUsage(err)
	}
	return page.ListenAndServe(ctx, addr, func(a string) {
		fmt.Fprintf(stdout, "status page of group %s: http://%s/ (metrics at /metrics); interrupt to stop\n", c.Config().Group, a)
	})
}

func whoOwnsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("who-owns", "-group G -topic T [flags] KEY", `The partition KEY routes to on topic T, with the partitioner the topic is produced with, and
that partition's owner, token, position and lag, and, for a sharded sink (-shards), the shard
that holds its fence, state and outbox rows. Partitioners: `+strings.Join(status.PartitionerNames(), ", ")+`.
`, stderr)
	var s sourceFlags
	s.register(fs, true)
	part := fs.String("partitioner", "murmur2", "how producers route keys: "+strings.Join(status.PartitionerNames(), ", "))
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err: err, printed: true}
	}
	if fs.NArg() != 1 {
		return usageError{err: fmt.Errorf("who-owns takes exactly one KEY, got %d arguments", fs.NArg())}
	}
	if s.topic == "" {
		return usageError{err: errors.New("who-owns needs the key's topic (-topic)")}
	}
	c, err := s.collector()
	if err != nil {
		return err
	}
	defer c.Close()
	o, err := c.WhoOwns(ctx, s.topic, fs.Arg(0), *part)
	if o == nil {
		return asUsage(err)
	}
	if s.json {
		if werr := status.WriteJSON(stdout, o); werr != nil {
			return werr
		}
	} else if werr := status.WriteOwnership(stdout, o); werr != nil {
		return werr
	}
	return err
}

func erasCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("eras", "-group G [-store S] [flags]", `The recorded recoveries (era advances) of a group's fences, oldest first: from which token to
which, its kind (a handover: the consumer fenced its own member's previous claimant at the same
generation, as after a static member's restart; a regression: the consumer recovered after the
group's generations went backwards; or an operator's) and the reason.
Reads only the store: for a sharded sink (-shards), every shard, each recovery with its shard
(a move's retirement is one, on the shard the key left). A shard that cannot be reached is
named, the others are listed, and the exit status is 1.
`, stderr)
	var s sourceFlags
	s.register(fs, true)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if s.group == "" {
		return usageError{err: errors.New("eras needs the consumer group (-group)")}
	}
	stores, err := s.stores()
	if err != nil {
		return err
	}
	var out []status.Recovery
	var where []string
	var errs []error
	for _, sh := range stores {
		recs, desc, err := shardRecoveries(ctx, sh, s.tables(), s.group, s.timeout)
		if err != nil {
			if sh.Name != "" {
				err = fmt.Errorf("shard %s: %w", sh.Name, err)
			}
			errs = append(errs, err)
			continue
		}
		where = append(where, desc)
		for _, r := range recs {
			if s.topic == "" || r.Key.Topic == s.topic {
				out = append(out, status.Recovery{Topic: r.Key.Topic, Partition: r.Key.Partition, From: r.From.String(), To: r.To.String(), Reason: r.Reason, At: r.At,
					Shard: sh.Name, Kind: status.RecoveryKind(r.Reason, r.From, r.To)})
			}
		}
	}
	// Oldest first across the shards.
	slices.SortStableFunc(out, func(a, b status.Recovery) int { return a.At.Compare(b.At) })
	err = errors.Join(errs...)
	if err != nil && len(where) == 0 {
		return asUsage(err)
	}
	if s.json {
		if out == nil {
			out = []status.Recovery{}
		}
		if werr := status.WriteJSON(stdout, out); werr != nil {
			return werr
		}
		return err
	}
	if len(out) == 0 {
		fmt.Fprintf(stdout, "no recoveries recorded for group %s in %s\n", s.group, strings.Join(where, ", "))
		return err
	}
	if werr := status.WriteRecoveries(stdout, out); werr != nil {
		return werr
	}
	return err
}

// shardRecoveries reads the group's recorded recoveries from one database, read-only.
func shardRecoveries(ctx context.Context, sh status.ShardAddr, tables status.Tables, group string, timeout time.Duration) ([]fence.Recovery, string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	st, err := status.OpenStore(ctx, sh.Store, tables, status.ReadOnly)
	if err != nil {
		return nil, "", err
	}
	defer st.Close()
	recs, err := st.Recoveries(ctx, group)
	return recs, st.Describe(), err
}

func recoverCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("recover", "-group G -topic T [-partition N,...] -reason TEXT [-force] [flags]", `An operator's recorded era advance: each partition's fence goes from its stored token
{era, epoch} to {era+1, -epoch} by a compare-and-set, recorded with the reason and who ran it.
Every old-era token is stale afterwards. Use it when a group's generations went backwards
(the group was deleted or recreated) and the consumer does not recover by itself.
Refused while a live member of the group owns a partition, unless -force. Nothing changes
unless every check passes.
`, stderr)
	var s sourceFlags
	s.register(fs, true)
	parts := fs.String("partition", "", "partitions to recover, comma separated (default: every partition of -topic with a fence row)")
	reason := fs.String("reason", "", "why (required; recorded with the recovery)")
	force := fs.Bool("force", false, "recover even partitions a live member owns")
	epoch := fs.Int64("epoch", 0, "the epoch of the new token (0 accepts the next owner at any generation)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if shards, err := s.shardAddrs(); err != nil {
		return err
	} else if shards != nil {
		return usageError{err: fmt.Errorf("recover works on one database: for a sharded sink, pass -store with the URL of the shard 'baton status' shows for the partition (-shards or $%s is set)", envShards)}
	}
	req := status.RecoverRequest{Topic: s.topic, Reason: *reason, Force: *force, Epoch: *epoch, Claimant: status.Claimant()}
	if *parts != "" {
		for _, f := range strings.Split(*parts, ",") {
			n, err := strconv.ParseInt(strings.TrimSpace(f), 10, 32)
			if err != nil || n < 0 {
				return usageError{err: fmt.Errorf("-partition %q: %q is not a partition number", *parts, f)}
			}
			req.Partitions = append(req.Partitions, int32(n))
		}
	}
	c, err := s.collector()
	if err != nil {
		return err
	}
	defer c.Close()
	done, err := c.Recover(ctx, req)
	if s.json && done != nil {
		if werr := status.WriteJSON(stdout, done); werr != nil {
			return werr
		}
	} else {
		for _, d := range done {
			forced := ""
			if d.Forced {
				forced = " (forced: a live member owned it)"
			}
			fmt.Fprintf(stdout, "recovered %s/%s/%d: %s -> %s, recorded as %s%s\n", s.group, d.Topic, d.Partition, d.From, d.To, req.Claimant, forced)
		}
	}
	return asUsage(err)
}

func schemaCmd(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("schema", "[-dialect postgres|sqlite] [flags]", `Prints the DDL of Baton's tables (fence, recoveries, keyed inbox, outbox, outbox cursors) as
the stores' Migrate runs it, for migration tools. Connects to nothing.
For a sharded sink (-shards, default $`+envShards+`):
the same DDL for every shard, then the placement table (baton_placements) for the home shard
only.
`, stderr)
	dialect := fs.String("dialect", "postgres", "postgres or sqlite")
	fence := fs.String("fence-table", "", "the fence table (default baton_fences)")
	outbox := fs.String("outbox-table", "", "the outbox table (default baton_outbox)")
	role := fs.String("runtime-role", "baton_runtime", "the least-privilege runtime role the GRANTs name (PostgreSQL)")
	var shards string
	registerShards(fs, &shards)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	list, err := shardList(fs, shards)
	if err != nil {
		return err
	}
	var names []string
	for _, n := range list {
		names = append(names, n.Name)
	}
	return asUsage(status.ShardedSchema(stdout, status.Dialect(*dialect), status.Tables{Fence: *fence, Outbox: *outbox}, *role, names))
}

func migrateCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("migrate", "-store S [flags]", `Creates Baton's tables (fence, recoveries, keyed inbox, outbox, outbox cursors) in the store
if they do not exist, with the stores' own Migrate: idempotent, and safe to run from several
processes at once (PostgreSQL: under an advisory lock). Run it as the migration role.
For a sharded sink (-shards, default $`+envShards+`):
every shard, and the placement table (baton_placements) in the home shard; a shard that cannot
be reached is named, the others are migrated, and the exit status is 1.
`, stderr)
	var s sourceFlags
	s.register(fs, false)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	stores, err := s.stores()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, max(s.timeout, 30*time.Second))
	defer cancel()
	return asUsage(status.MigrateShards(ctx, stdout, stores, s.tables()))
}

func topicsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	verb := ""
	if len(args) > 0 && (args[0] == "reset" || args[0] == "ack") {
		verb, args = args[0], args[1:]
	}
	name := strings.TrimSpace("topics " + verb)
	use, doc := "-group G [-topic T] [flags]", `Each topic's identity stored with the group's fences (its Kafka topic ID and acknowledged
partition count) against the brokers' view: ok, recreated (deleted and created again under the
same name: the consumer holds its partitions), grown (partitions added: the consumer holds
the new ones), missing, or not seen (no claim since the upgrade), with the recorded history.

  baton topics reset -group G -topic T -reason TEXT
      accept a recreated topic: every fence of the topic moves to a new era with no position
      (recorded as recoveries) and the consumer reads the new incarnation from its beginning.
  baton topics ack -group G -topic T -reason TEXT
      acknowledge growth, after the older partitions drained the records produced before it
      (see the drain-then-grow procedure in the README); the new partitions are then processed.
      A standalone relay's shard count is its coordination topic's partition count: ack its
      growth with the relay's group, after every shard's outbox backlog is 0.
`
	if verb != "" {
		use = "-group G -topic T -reason TEXT [flags]"
	}
	fs := newFlagSet(name, use, doc, stderr)
	var s sourceFlags
	s.register(fs, true)
	reason := fs.String("reason", "", "why (required by reset and ack; recorded)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if shards, err := s.shardAddrs(); err != nil {
		return err
	} else if shards != nil {
		return usageError{err: fmt.Errorf("topics works on one database: a sharded sink keeps its topic identities in the home shard (pass -store with its URL to list them), and resets them on every shard through its router's ResetTopic (fence/shard), not with this command (-shards or $%s is set)", envShards)}
	}
	c, err := s.collector()
	if err != nil {
		return err
	}
	defer c.Close()
	if verb != "" {
		req := status.TopicResetRequest{Topic: s.topic, Growth: verb == "ack", Reason: *reason, Claimant: status.Claimant()}
		from, to, err := c.ResetTopic(ctx, req)
		if err != nil {
			return asUsage(err)
		}
		fmt.Fprintf(stdout, "%s/%s: %s -> %s, recorded as %s\n", s.group, s.topic, from, to, req.Claimant)
		return nil
	}
	ts, err := c.Topics(ctx)
	if err != nil {
		return asUsage(err)
	}
	if s.json {
		if ts == nil {
			ts = []status.TopicIdentity{}
		}
		return status.WriteJSON(stdout, ts)
	}
	return status.WriteTopics(stdout, ts)
}
