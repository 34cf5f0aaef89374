package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/batonhq/baton/internal/operator/audit"
	"github.com/batonhq/baton/internal/operator/status"
	"github.com/batonhq/baton/internal/operator/telemetry"
)

// errViolations is a pass of 'audit -once' that found violations: exit status 1.
var errViolations = errors.New("violations found")

func auditCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("audit", "-group G [-brokers B] [-store S] [-output-topics T,...] [-once | -http ADDR] [flags]", `Judges a group's safety invariants online, from what Baton records (fences, recoveries,
outbox rows and cursors, inbox admissions: the store, read-only) and from Kafka (committed
offsets, log start and end, the outbox's output topics read incrementally). Checks, per
partition: skipped (position within the log: data loss, committed offset ahead; a topic
recreated and not yet reset is named, its old positions not judged against the new log), tokens (never
back, every era recorded), outbox (gap-free, cursor never past an undelivered row, oldest row
age), delivery (no copy of a sequence never allocated, first copies' tokens never back),
inbox (admissions never back), liveness (a lagging partition whose position stands still),
ownership (a fence held by a member the stable group no longer assigns the partition to past
-handover; offsets committed on a partition no fence claims: a writer without the fence).
Each violation is logged at ERROR with its evidence and counted in baton.audit.violations.

With -once: one pass, printed; exit status 0 when every check passed, 1 when a violation was
found, a source could not be read or the store has no fence rows for the group. Judgements
comparing two observations need the long-running form: a pass every -interval, with -http
serving / (the violations), /violations.json and /metrics.

A sharded sink (-shards, default $`+envShards+`):
each shard's fences, outbox and inbox are audited and reported per shard; a fence is judged on
the shard the placement (in the home shard) puts its partition on, and a fence a move retired
is not judged. A shard that cannot be read is named, the others are audited, and the exit
status is 1.
`, stderr)
	var s sourceFlags
	s.register(fs, true)
	once := fs.Bool("once", false, "one pass, then exit (status 1 if a violation was found)")
	interval := fs.Duration("interval", 30*time.Second, "how often a pass reads the sources")
	addr := fs.String("http", "", "serve the violations and /metrics on this address (e.g. 127.0.0.1:9464)")
	outputs := fs.String("output-topics", "", "the outbox's destination topics, comma separated (every one; without them the delivery judgements are skipped)")
	age := fs.Duration("outbox-age", 5*time.Minute, "the oldest pending outbox row's age bound")
	stall := fs.Duration("stall", 5*time.Minute, "how long a lagging partition's position may stand still")
	handover := fs.Duration("handover", time.Minute, "how long a stable group's partition may stay claimed by a member that does not own it")
	maxBytes := fs.Int64("max-bytes", 64<<20, "bytes read from the output topics per pass at most")
	inboxRows := fs.Int("inbox-rows", 10000, "inbox admissions read per pass at most")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *interval <= 0 {
		return usageError{err: fmt.Errorf("-interval %s is not positive", *interval)}
	}
	if *once && *addr != "" {
		return usageError{err: errors.New("-once and -http exclude each other")}
	}
	log, err := s.logger(stderr)
	if err != nil {
		return err
	}
	m, err := telemetry.New(ctx, telemetry.ServiceName("baton-audit"), telemetry.OTLPFromEnv())
	if err != nil {
		return asUsage(err)
	}
	defer func() { _ = m.Shutdown(context.Background()) }()
	shards, err := s.shardAddrs()
	if err != nil {
		return err
	}
	cfg := audit.Config{Store: s.store, Shards: shards, Group: s.group, Tables: s.tables(), Timeout: s.timeout,
		OutboxAge: *age, Stall: *stall, Handover: *handover, MaxBytes: *maxBytes, InboxRows: *inboxRows,
		Logger: log, Meter: m.Provider()}
	if s.brokers != "" {
		cfg.Brokers = strings.Split(s.brokers, ",")
	}
	if s.topic != "" {
		cfg.Topics = []string{s.topic}
	}
	if *outputs != "" {
		cfg.OutputTopics = strings.Split(*outputs, ",")
	}
	a, err := audit.New(cfg)
	if err != nil {
		return asUsage(err)
	}
	defer a.Close()
	if *once {
		r, err := a.Pass(ctx)
		if s.json {
			if werr := status.WriteJSON(stdout, r); werr != nil {
				return werr
			}
		} else {
			writeAudit(stdout, s.group, r)
		}
		switch {
		case err == nil && len(r.Violations) > 0:
			err = fmt.Errorf("%w: %d", errViolations, len(r.Violations))
		case err == nil && r.Partitions == 0:
			err = fmt.Errorf("the store has no fence rows for group %q: nothing was audited (is -store the database the group's members write to, and -fence-table its table?)", s.group)
		}
		return err
	}
	if *addr == "" {
		fmt.Fprintf(stdout, "auditing group %s every %s; interrupt to stop\n", s.group, *interval)
		return a.Run(ctx, *interval)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", *addr, err)
	}
	srv := &http.Server{Handler: a.Handler(m.Handler()), ReadHeaderTimeout: 5 * time.Second}
	fmt.Fprintf(stdout, "auditing group %s every %s: http://%s/ (metrics at /metrics); interrupt to stop\n", s.group, *interval, ln.Addr())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = srv.Serve(ln)
	}()
	err = a.Run(ctx, *interval)
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = srv.Shutdown(sctx)
	cancel()
	wg.Wait()
	return err
}

// writeAudit prints one pass's report.
func writeAudit(w io.Writer, group string, r *audit.Report) {
	if r == nil {
		return
	}
	for _, v := range r.Violations {
		fmt.Fprintln(w, "VIOLATION", v)
	}
	for _, e := range r.Errors {
		fmt.Fprintln(w, "not read:", e)
	}
	for _, sh := range r.Shards {
		if sh.Error != "" {
			fmt.Fprintf(w, "shard %s (%s): not read\n", sh.Name, sh.Addr)
			continue
		}
		fmt.Fprintf(w, "shard %s (%s): %d partitions, %d retired fences (not judged), %d violations, %d store queries\n",
			sh.Name, sh.Addr, sh.Partitions, sh.Retired, sh.Violations, sh.Queries)
	}
	for _, t := range r.Recreated {
		fmt.Fprintf(w, "topic %s recreated (topic id stored with the fences %s, on the brokers %s): %d fences not judged against the log until 'baton topics reset'\n",
			t.Topic, t.StoredID, t.BrokerID, t.Fences)
	}
	fmt.Fprintf(w, "group %s: %d partitions, %d violations; %d store queries, %d Kafka requests, %d bytes read from the output topics, %d re-published copies, in %s\n",
		group, r.Partitions, len(r.Violations), r.Queries, r.Requests, r.BytesRead, r.Republished, r.Took)
}
