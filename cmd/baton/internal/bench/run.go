package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Info describes a design of the run.
type Info struct {
	Name  string
	About string
	Slow  bool // one transaction per record: runs on the smaller topic (Config.SlowRecords)
	Peer  bool // served by the peers binary (the nested module cmd/baton/internal/bench/peers)
	// SQLite: the design folds into an SQLite file (Job.SQLite) instead of PostgreSQL; its
	// ceiling is sqlite-ceiling.
	SQLite bool
	// ReadOnly: the design writes nothing, so there is no fold to check; its run counts when
	// the worker saw every record.
	ReadOnly bool
	// Redis: the design folds into Redis hashes ([Job.RedisKey]) instead of PostgreSQL; the
	// run checks them through Config.RedisFold.
	Redis bool
	// Twins: the design runs the README's program, which keeps each key's last value and
	// count in its twins table (in the SQLite file) instead of the fold: [CheckTwins].
	Twins bool
}

// All lists every design, in the order of the table. Baton's are served by cmd/baton.
var All = []Info{
	{Name: "baton", About: "the README's program (internal/readme): Baton, fenced, into SQLite (sqlitefence), its handler one upsert statement per record in the batch's transaction, into the twins table (last value and count per key)", SQLite: true, Twins: true},
	{Name: "baton-pg", About: "the same handler shape on PostgreSQL: Baton, fenced (pgfence), one upsert statement per record, which the handler's transaction queues and sends in one round trip before the commit"},
	{Name: "baton-pg-sync", About: "baton-pg without the pipelining: the store's Advance, then one upsert statement per record, each a round trip of its own, in a transaction the bench holds"},
	{Name: "baton-fast", About: "Baton, fenced, the fast write path: pgbulk unnest upserts (1000 rows a statement, merged per key) sent in one batch with the fence statement (pgbulk.Sink over pgfence)"},
	{Name: "baton-unfenced", About: "Baton's runtime over a sink that keeps no fence (begin, handler, commit), the same pgbulk handler: the fence's cost"},
	{Name: "watermill", About: "watermill: Kafka subscriber -> SQL (PostgreSQL) pub/sub -> SQL subscriber applying each message in the transaction that consumes it (TxFromContext)", Slow: true, Peer: true},
	{Name: "redislock", About: "a Redis lock per key (SET NX PX, compare-and-delete) around each write, one transaction per record, 8 workers", Slow: true},
	{Name: "naive", About: "one upsert per record in a transaction of its own (autocommit), one record at a time", Slow: true},
	{Name: "ceiling", About: "no Kafka, no fence: the same records in 1000-record chunks per partition, merged per key, one unnest statement each, over N connections (best N of the run)"},
	{Name: "kafka-read", About: "no database: a consumer group member polling the topic and counting its records, the ceiling of anything this broker feeds on this machine (nothing to check: it writes nothing)", ReadOnly: true},
	{Name: "sqlite-fast", About: "Baton, fenced, into SQLite (sqlitefence, WAL, synchronous=FULL): the fast write path, sqlitebulk's prepared multi-row upserts merged per key inside the store's Apply", SQLite: true},
	{Name: "sqlite-unfenced", About: "Baton's runtime into the same SQLite file settings over a sink that keeps no fence (begin, handler, commit), the same sqlitebulk handler: the fence's cost", SQLite: true},
	{Name: "sqlite-ceiling", About: "no Kafka, no fence: the same records in 1000-record chunks per partition, merged per key, sqlitebulk's statements, one transaction each, one writer (SQLite admits one)", SQLite: true},
	{Name: "redis-fast", About: "Baton, fenced, into Redis (redisfence): each key's fold in a hash, the batch merged per key (the stored folds read in one pipeline) and written as one HSET per key in the store's one script with the fence", Redis: true},
	{Name: "redis-unfenced", About: "Baton's runtime into the same Redis over a sink that keeps no fence, the same handler: the same HSETs sent in one MULTI/EXEC pipeline: the fence's cost", Redis: true},
}

// RedisFold is what the harness needs of Redis for the redis- designs. cmd/baton supplies
// it: this package imports no Redis client, so that the peers' module needs none.
type RedisFold interface {
	// Settings describes the server's durability settings, printed with the results.
	Settings(ctx context.Context) (string, error)
	// Check is [Check] of the job's fold in Redis: every key's hash, at [Job.RedisKey].
	Check(ctx context.Context, job Job) error
	// Clean removes the job's keys: its fold and its fences.
	Clean(ctx context.Context, job Job) error
}

// SQLiteCeiling is the design the SQLite designs' "vs ceiling" divides by.
const SQLiteCeiling = "sqlite-ceiling"

// Reference is the design every ratio "vs Baton" divides by.
const Reference = "baton-fast"

// Config is one 'baton bench' run.
type Config struct {
	Records, Keys, Partitions int
	Size                      int           // bytes of a record (key, value, headers), padded with a header; 0: unpadded
	Fetch                     FetchSettings // the consumer designs' fetch options
	SlowRecords               int           // records of the topic the slow designs run on
	Rounds                    int           // each design runs once per round, the order rotating
	Designs                   []string      // names from All; empty: all
	Conns                     []int         // the ceiling's connection counts to try
	Timeout                   time.Duration // per run
	Brokers                   []string
	Postgres, Redis           string
	RedisFold                 RedisFold // checks the redis- designs' fold; needed by them
	Self                      []string  // command that serves Baton's and the native designs (+ WorkerCommand)
	Peers                     []string  // command that serves the peers' designs
	Out                       string    // directory for RESULTS.md and chart.svg; empty: none
	Profile                   string    // directory for each worker's CPU profile; empty: none
	Command                   string    // the command line, for the results
	Progress                  io.Writer
}

// Result is one run of one design.
type Result struct {
	Design string // with the ceiling's connections: "ceiling/4"
	Round  int
	Report Report
	Err    error // the run failed or its check did: it does not count
}

// Run prepares the topics and the schema, runs every design Rounds times in rotating order,
// checks each run, and writes the summary. It fails if any run failed or was wrong.
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if slices.ContainsFunc(cfg.designs(), func(i Info) bool { return i.Peer }) && len(cfg.Peers) == 0 {
		return nil, fmt.Errorf("%w: the watermill design needs the peers binary", ErrUsage)
	}
	out := cfg.Progress
	perKey := int64(cfg.Records / cfg.Keys)
	slowPerKey := int64(max(cfg.SlowRecords/cfg.Keys, 1))
	stamp := time.Now().UTC().Format("20060102t150405")
	load0 := LoadAvg()

	schema := "baton_bench_" + stamp
	dropSchema, err := createSchema(ctx, cfg.Postgres, schema, out)
	if err != nil {
		return nil, err
	}
	defer dropSchema()
	job := Job{Brokers: cfg.Brokers, Partitions: cfg.Partitions, Postgres: cfg.Postgres, Schema: schema,
		Redis: cfg.Redis, Keys: cfg.Keys, Timeout: cfg.Timeout, Profile: cfg.Profile, FetchSettings: cfg.Fetch}
	db, err := job.Pool(ctx, 2)
	if err != nil {
		return nil, err
	}
	defer db.Close()

	designs := cfg.designs()
	topics, records := map[bool]string{}, map[bool]int64{}
	if slices.ContainsFunc(designs, func(i Info) bool { return !i.Slow }) {
		topics[false] = "baton-bench-" + stamp
		records[false] = perKey * int64(cfg.Keys)
	}
	if slices.ContainsFunc(designs, func(i Info) bool { return i.Slow }) {
		topics[true] = "baton-bench-slow-" + stamp
		records[true] = slowPerKey * int64(cfg.Keys)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(cfg.Brokers...), kgo.ProducerLinger(5*time.Millisecond),
		kgo.MetadataMinAge(100*time.Millisecond)) // a new topic: ask again soon, not after 5s
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for slow, t := range topics {
		if _, err := adm.CreateTopic(ctx, int32(cfg.Partitions), 1, nil, t); err != nil {
			return nil, fmt.Errorf("create topic %s: %w", t, err)
		}
		defer func() { _, _ = adm.DeleteTopics(context.WithoutCancel(ctx), t) }()
		if err := awaitTopic(ctx, adm, t, cfg.Partitions); err != nil {
			return nil, err
		}
		t0 := time.Now()
		recs := Records(cfg.Keys, records[slow]/int64(cfg.Keys))
		pad(recs, cfg.Size)
		if err := produce(ctx, cl, t, recs); err != nil {
			return nil, err
		}
		fmt.Fprintf(out, "produced %d records over %d keys to %s (%d partitions) in %s\n", records[slow], cfg.Keys, t, cfg.Partitions, time.Since(t0).Round(time.Millisecond))
	}

	var redisSettings string
	if slices.ContainsFunc(designs, func(i Info) bool { return i.Redis }) {
		if redisSettings, err = cfg.RedisFold.Settings(ctx); err != nil {
			return nil, fmt.Errorf("redis settings: %w", err)
		}
		fmt.Fprintf(out, "redis %s: %s\n", cfg.Redis, redisSettings)
	}

	type entry struct {
		info  Info
		name  string
		conns int
	}
	var entries []entry
	for _, d := range designs {
		if d.Name == "ceiling" {
			for _, n := range cfg.Conns {
				entries = append(entries, entry{d, fmt.Sprintf("ceiling/%d", n), n})
			}
			continue
		}
		entries = append(entries, entry{d, d.Name, 0})
	}
	var results []Result
	var groups []string
	defer func() { // the runs' consumer groups, so that a shared broker does not collect them
		if len(groups) > 0 {
			_, _ = adm.DeleteGroups(context.WithoutCancel(ctx), groups...)
		}
	}()
	for round := range cfg.Rounds {
		order := slices.Clone(entries)
		if round%2 == 1 {
			// Odd rounds run the list backwards: rotating alone keeps every pair of neighbours
			// in the same order (baton-fast always just before baton-unfenced), so whatever a
			// run leaves behind (a checkpoint, autovacuum, a warm cache) would always fall on
			// the same one of the two.
			slices.Reverse(order)
		}
		for i := range order {
			e := order[(i+round)%len(order)] // rotate the order between rounds
			j := job
			j.Design, j.Conns = e.info.Name, e.conns
			j.Topic, j.Records = topics[e.info.Slow], records[e.info.Slow]
			j.Group = fmt.Sprintf("baton-bench-%s-%s-%d", strings.ReplaceAll(e.name, "/", "-"), stamp, round)
			groups = append(groups, j.Group)
			res := Result{Design: e.name, Round: round}
			res.Report, res.Err = runOne(ctx, cfg, e.info, j, db)
			results = append(results, res)
			if res.Err != nil {
				fmt.Fprintf(out, "round %d %-15s FAILED: %v\n", round+1, e.name, res.Err)
				if ctx.Err() != nil {
					return results, ctx.Err()
				}
				continue
			}
			r := res.Report
			fmt.Fprintf(out, "round %d %-15s %8.0f records/s  %7d records  %6d tx  first %6.1fms  p50 %6.1fms  p99 %7.1fms  rss %4d MiB  fetched %.2fx  (load %s)\n",
				round+1, e.name, r.Rate(), r.Records, r.Batches, ms(r.First), ms(r.P50), ms(r.P99), r.RSS>>20, float64(r.Fetched)/float64(r.Records), LoadAvg())
			if len(r.Phases) > 0 {
				fmt.Fprintf(out, "        %-15s before the first commit: %s\n", "", PhaseLine(r.Phases))
			}
		}
	}
	sum := Summarize(results)
	conds := Conditions{Start: load0, End: LoadAvg(), CPUs: runtime.NumCPU(), Go: runtime.Version(), Date: time.Now().UTC(),
		Records: records[false], SlowRecords: records[true], Keys: cfg.Keys, Partitions: cfg.Partitions, Rounds: cfg.Rounds,
		Command: cfg.Command, Redis: redisSettings}
	fmt.Fprintln(out)
	WriteTable(out, sum, conds)
	if cfg.Out != "" {
		if err := writeOut(cfg.Out, sum, conds); err != nil {
			return results, err
		}
		fmt.Fprintf(out, "\nwrote %s and %s\n", filepath.Join(cfg.Out, "RESULTS.md"), filepath.Join(cfg.Out, "chart.svg"))
	}
	var errs []error
	for _, r := range results {
		if r.Err != nil {
			errs = append(errs, fmt.Errorf("%s (round %d): %w", r.Design, r.Round+1, r.Err))
		}
	}
	return results, errors.Join(errs...)
}

// ErrUsage marks a configuration that cannot run.
var ErrUsage = errors.New("bench: usage")

// Validate reports every problem of cfg at once, wrapping [ErrUsage]; it does no I/O.
func (cfg *Config) Validate() error {
	var errs []error
	if cfg.Keys < 1 {
		errs = append(errs, fmt.Errorf("-keys %d: want at least 1", cfg.Keys))
	}
	if cfg.Records < cfg.Keys {
		errs = append(errs, fmt.Errorf("-records %d: want at least -keys (%d)", cfg.Records, cfg.Keys))
	}
	if cfg.Partitions < 1 {
		errs = append(errs, fmt.Errorf("-partitions %d: want at least 1", cfg.Partitions))
	}
	if cfg.Rounds < 1 {
		errs = append(errs, fmt.Errorf("-rounds %d: want at least 1", cfg.Rounds))
	}
	if len(cfg.Conns) == 0 || slices.ContainsFunc(cfg.Conns, func(n int) bool { return n < 1 }) {
		errs = append(errs, fmt.Errorf("-conns %v: want one or more counts >= 1", cfg.Conns))
	}
	for _, d := range cfg.Designs {
		if !slices.ContainsFunc(All, func(i Info) bool { return i.Name == d }) {
			errs = append(errs, fmt.Errorf("unknown design %q", d))
		}
	}
	ds := cfg.designs()
	if slices.ContainsFunc(ds, func(i Info) bool { return i.Name == "redislock" || i.Redis }) && cfg.Redis == "" {
		errs = append(errs, errors.New("the redislock and redis- designs need Redis (-redis or BATON_REDIS_ADDR)"))
	}
	if slices.ContainsFunc(ds, func(i Info) bool { return i.Redis }) && cfg.RedisFold == nil {
		errs = append(errs, errors.New("the redis- designs need Config.RedisFold to check their fold"))
	}
	if len(cfg.Brokers) == 0 || cfg.Postgres == "" {
		errs = append(errs, errors.New("needs Kafka and PostgreSQL (-brokers, -postgres, or BATON_KAFKA_BROKERS and BATON_POSTGRES_URL; 'make up' starts them)"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrUsage, errors.Join(errs...))
	}
	return nil
}

func (cfg *Config) designs() []Info {
	if len(cfg.Designs) == 0 {
		return All
	}
	var out []Info
	for _, i := range All {
		if slices.Contains(cfg.Designs, i.Name) {
			out = append(out, i)
		}
	}
	return out
}

// runOne runs one design in a worker process over an emptied fold table, then checks it.
func runOne(ctx context.Context, cfg Config, info Info, job Job, db *pgxpool.Pool) (Report, error) {
	if info.SQLite {
		dir, err := os.MkdirTemp("", "baton-bench-sqlite-")
		if err != nil {
			return Report{}, err
		}
		defer os.RemoveAll(dir)
		job.SQLite = filepath.Join(dir, "fold.db")
	} else if info.Redis {
		defer func() {
			if err := cfg.RedisFold.Clean(context.WithoutCancel(ctx), job); err != nil {
				fmt.Fprintf(cfg.Progress, "clean the Redis keys of %s: %v\n", job.Group, err)
			}
		}()
	} else if err := Reset(ctx, db); err != nil {
		return Report{}, err
	}
	argv := cfg.Self
	if info.Peer {
		argv = cfg.Peers
	}
	js, err := json.Marshal(job)
	if err != nil {
		return Report{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, job.Timeout+time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], append(slices.Clone(argv[1:]), WorkerCommand, "-job", string(js))...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		return Report{}, fmt.Errorf("worker: %w\n%s", err, tail(stderr.String(), 20))
	}
	var rep Report
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &rep); err != nil {
		return Report{}, fmt.Errorf("worker report %q: %w", lines[len(lines)-1], err)
	}
	switch {
	case info.ReadOnly:
		return rep, nil
	case info.Twins:
		return rep, CheckTwins(ctx, job.SQLite, job.Keys, job.PerKey())
	case info.SQLite:
		return rep, CheckSQLite(ctx, job.SQLite, job.Keys, job.PerKey())
	case info.Redis:
		return rep, cfg.RedisFold.Check(ctx, job)
	}
	return rep, Check(ctx, db, job.Keys, job.PerKey())
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// produce writes recs to topic and waits for every acknowledgement.
func produce(ctx context.Context, cl *kgo.Client, topic string, recs []*kgo.Record) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for _, r := range recs {
		r.Topic = topic
		wg.Add(1)
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			defer wg.Done()
			if err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if first != nil {
		return fmt.Errorf("produce to %s: %w", topic, first)
	}
	return nil
}

// LoadAvg returns the 1, 5 and 15 minute load averages as /proc/loadavg shows them.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// awaitTopic waits, up to a minute, until every partition of a topic just created has a
// leader: a broker busy with other topics (one of hundreds of partitions deleted just before)
// can take longer than a producer's retries of an unknown topic.
func awaitTopic(ctx context.Context, adm *kadm.Client, topic string, partitions int) error {
	deadline := time.Now().Add(time.Minute)
	for {
		tds, err := adm.ListTopics(ctx, topic)
		if err == nil {
			td := tds[topic]
			ready := td.Err == nil && len(td.Partitions) == partitions
			for _, p := range td.Partitions {
				ready = ready && p.Err == nil && p.Leader >= 0
			}
			if ready {
				return nil
			}
			err = cmpErr(td.Err, fmt.Errorf("%d of %d partitions listed", len(td.Partitions), partitions))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("topic %s not ready after a minute: %w", topic, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// createSchema creates the run's schema on the database at url and returns the function that
// drops it (a failure to drop is reported on out).
func createSchema(ctx context.Context, url, schema string, out io.Writer) (func(), error) {
	admin, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		admin.Close()
		return nil, fmt.Errorf("create schema: %w", err)
	}
	return func() {
		defer admin.Close()
		if _, err := admin.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			fmt.Fprintf(out, "drop schema %s: %v\n", schema, err)
		}
	}, nil
}
