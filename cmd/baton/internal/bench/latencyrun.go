package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Rate is a latency run's production rate: PerSecond records a second, or when Fraction is
// set, that fraction of a design's throughput measured just before in the same command: Of's,
// or when Of is empty the design's own (kafka-read's: the Reference's, whose floor it is).
type Rate struct {
	PerSecond float64
	Fraction  float64
	Of        string
}

// ParseRate reads "10000" (records a second), "50%" (of the design's own throughput) or
// "50%baton-fast" (of that design's).
func ParseRate(s string) (Rate, error) {
	s = strings.TrimSpace(s)
	if p, of, ok := strings.Cut(s, "%"); ok {
		f, err := strconv.ParseFloat(p, 64)
		if err != nil || f <= 0 || f > 100 {
			return Rate{}, fmt.Errorf("rate %q: want a percentage in (0, 100]", s)
		}
		if of != "" && !slices.ContainsFunc(All, func(i Info) bool { return i.Name == of }) {
			return Rate{}, fmt.Errorf("rate %q: unknown design %q", s, of)
		}
		return Rate{Fraction: f / 100, Of: of}, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f <= 0 {
		return Rate{}, fmt.Errorf("rate %q: want records a second (> 0) or a percentage of a design's throughput", s)
	}
	return Rate{PerSecond: f}, nil
}

func (r Rate) String() string {
	if r.Fraction > 0 {
		return fmt.Sprintf("%g%%%s", r.Fraction*100, r.Of)
	}
	return fmt.Sprintf("%.0f/s", r.PerSecond)
}

// base is the design whose throughput a Fraction rate of design takes.
func (r Rate) base(design string) string {
	switch {
	case r.Of != "":
		return r.Of
	case design == KafkaReadDesign:
		return Reference
	}
	return design
}

// LatencyConfig is one 'baton bench latency' run: for each design and rate, a producer writes
// the job's records at the rate while the design consumes them, and the worker times every
// record from its produce timestamp to its transaction's commit ([Latency]).
type LatencyConfig struct {
	// Config gives the services, the designs (default: baton-fast, baton), Keys, Partitions,
	// Timeout, Self, Progress, Out and Command; Records is the size of the topic the
	// throughput of a design is measured on, for a Fraction rate.
	Config
	Rates            []Rate
	Warmup, Duration time.Duration // the window: from first commit + Warmup; production lasts Warmup + Duration + a second
	// FetchMaxWaits are variants: every design also runs at the first rate with each of these
	// kgo.FetchMaxWait (the main runs keep the design's default: Baton's consumer sets 100ms,
	// kafka-read keeps franz-go's 5s).
	FetchMaxWaits []time.Duration
	Linger        time.Duration // the producer's kgo.ProducerLinger
}

// LatencyDesigns are the designs a latency run measures by default: Baton's fast path and its
// handler design as the README shows it.
var LatencyDesigns = []string{Reference, "baton"}

// LatencyResult is one latency run.
type LatencyResult struct {
	Design       string
	FetchMaxWait time.Duration // 0: franz-go's default
	Rate         Rate
	Target       float64 // records a second asked of the producer
	Produced     float64 // records a second the producer achieved
	Throughput   float64 // with a Fraction rate: the design's measured throughput
	Report       Report
	Err          error
}

// startupSlack is how much longer than Warmup + Duration the producer writes: about the time
// a worker takes to start, join and claim, so that the window lasts about Duration.
const startupSlack = time.Second

// RunLatency runs every design at every rate (and the FetchMaxWait variants), each on a
// topic of its own written while it runs, checks every run's fold, and writes the summary.
// It fails if any run failed or was wrong.
func RunLatency(ctx context.Context, cfg LatencyConfig) ([]LatencyResult, error) {
	if len(cfg.Designs) == 0 {
		cfg.Designs = LatencyDesigns
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var errs []error
	if len(cfg.Rates) == 0 {
		errs = append(errs, errors.New("no rate"))
	}
	if cfg.Warmup < 0 || cfg.Duration <= 0 {
		errs = append(errs, fmt.Errorf("-warmup %v, -duration %v: want >= 0 and > 0", cfg.Warmup, cfg.Duration))
	}
	for _, d := range cfg.designs() {
		if d.Slow || d.Peer || strings.HasPrefix(d.Name, "ceiling") || d.Name == SQLiteCeiling {
			errs = append(errs, fmt.Errorf("design %s: a latency run takes Baton's consumer designs and kafka-read", d.Name))
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrUsage, errors.Join(errs...))
	}
	out := cfg.Progress
	stamp := time.Now().UTC().Format("20060102t150405")
	load0 := LoadAvg()
	schema := "baton_bench_" + stamp
	dropSchema, err := createSchema(ctx, cfg.Postgres, schema, out)
	if err != nil {
		return nil, err
	}
	defer dropSchema()
	base := Job{Brokers: cfg.Brokers, Partitions: cfg.Partitions, Postgres: cfg.Postgres, Schema: schema,
		Redis: cfg.Redis, Keys: cfg.Keys, Profile: cfg.Profile, FetchSettings: cfg.Fetch}
	db, err := base.Pool(ctx, 2)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(cfg.Brokers...), kgo.ProducerLinger(cfg.Linger),
		kgo.MetadataMinAge(100*time.Millisecond)) // a new topic: ask again soon, not after 5s
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	var topics, groups []string
	defer func() {
		if len(topics) > 0 {
			_, _ = adm.DeleteTopics(context.WithoutCancel(ctx), topics...)
		}
		if len(groups) > 0 {
			_, _ = adm.DeleteGroups(context.WithoutCancel(ctx), groups...)
		}
	}()
	newTopic := func(name string) error {
		if _, err := adm.CreateTopic(ctx, int32(cfg.Partitions), 1, nil, name); err != nil {
			return fmt.Errorf("create topic %s: %w", name, err)
		}
		topics = append(topics, name)
		return awaitTopic(ctx, adm, name, cfg.Partitions)
	}

	// The throughput of the designs a Fraction rate needs, on one pre-produced topic.
	var need []string
	for _, r := range cfg.Rates {
		for _, d := range cfg.designs() {
			if b := r.base(d.Name); r.Fraction > 0 && !slices.Contains(need, b) {
				need = append(need, b)
			}
		}
	}
	throughput := map[string]float64{}
	if len(need) > 0 {
		t := "baton-bench-tput-" + stamp
		if err := newTopic(t); err != nil {
			return nil, err
		}
		perKey := int64(cfg.Records / cfg.Keys)
		if err := produce(ctx, cl, t, Records(cfg.Keys, perKey)); err != nil {
			return nil, err
		}
		for _, name := range need {
			d := All[slices.IndexFunc(All, func(i Info) bool { return i.Name == name })]
			j := base
			j.Design, j.Topic, j.Records, j.Timeout = d.Name, t, perKey*int64(cfg.Keys), cfg.Timeout
			j.Group = fmt.Sprintf("baton-bench-tput-%s-%s", d.Name, stamp)
			groups = append(groups, j.Group)
			rep, err := runOne(ctx, cfg.Config, d, j, db)
			if err != nil {
				return nil, fmt.Errorf("%s: throughput run: %w", d.Name, err)
			}
			throughput[d.Name] = rep.Rate() // as 'baton bench' reports it: from the client's start
			fmt.Fprintf(out, "throughput %-15s %8.0f records/s (%d records, first commit %.0fms)\n", d.Name, rep.Rate(), rep.Records, ms(rep.First))
		}
	}

	type entry struct {
		info Info
		rate Rate
		wait time.Duration
	}
	var entries []entry
	for _, r := range cfg.Rates {
		for _, d := range cfg.designs() {
			entries = append(entries, entry{d, r, 0})
		}
	}
	for _, w := range cfg.FetchMaxWaits {
		for _, d := range cfg.designs() {
			entries = append(entries, entry{d, cfg.Rates[0], w})
		}
	}
	var results []LatencyResult
	for i, e := range entries {
		res := LatencyResult{Design: e.info.Name, FetchMaxWait: e.wait, Rate: e.rate, Target: e.rate.PerSecond}
		if e.rate.Fraction > 0 {
			res.Throughput = throughput[e.rate.base(e.info.Name)]
			res.Target = e.rate.Fraction * res.Throughput
		}
		t := fmt.Sprintf("baton-bench-lat-%s-%d", stamp, i)
		if err := newTopic(t); err != nil {
			return results, err
		}
		span := cfg.Warmup + cfg.Duration + startupSlack
		perKey := max(int64(math.Ceil(res.Target*span.Seconds()/float64(cfg.Keys))), 1)
		j := base
		j.Design, j.Topic, j.Records = e.info.Name, t, perKey*int64(cfg.Keys)
		j.Timeout = cfg.Timeout + span
		j.Latency, j.Warmup = true, cfg.Warmup
		if e.wait > 0 {
			j.FetchMaxWait = e.wait
		}
		res.FetchMaxWait = j.FetchMaxWait
		j.Group = fmt.Sprintf("baton-bench-lat-%s-%s-%d", e.info.Name, stamp, i)
		groups = append(groups, j.Group)
		res.Report, res.Produced, res.Err = latencyOne(ctx, cfg, e.info, j, db, cl, res.Target, perKey)
		if res.Err == nil && (res.Report.Latency == nil || res.Report.Latency.Records == 0) {
			res.Err = errors.New("no latency measured: the design does not time its records end to end, or the window was empty (raise -duration)")
		}
		results = append(results, res)
		if res.Err != nil {
			fmt.Fprintf(out, "latency %-15s %-22s FAILED: %v\n", e.info.Name, e.rate.String(), res.Err)
			if ctx.Err() != nil {
				return results, ctx.Err()
			}
			continue
		}
		l := res.Report.Latency
		fmt.Fprintf(out, "latency %-15s target %7.0f/s produced %7.0f/s%s: steady %7.0f records/s  p50 %6.1fms  p99 %6.1fms  max %6.1fms  commit p50 %5.1fms  batch %5.1f  first %6.1fms  rss %4d MiB  (load %s)\n",
			e.info.Name, res.Target, res.Produced, waitNote(e.wait), l.Rate(), ms(l.P50), ms(l.P99), ms(l.Max), ms(l.CommitP50), l.Batch(), ms(res.Report.First), res.Report.RSS>>20, LoadAvg())
	}
	conds := Conditions{Start: load0, End: LoadAvg(), CPUs: runtime.NumCPU(), Go: runtime.Version(), Date: time.Now().UTC(),
		Keys: cfg.Keys, Partitions: cfg.Partitions, Rounds: 1, Command: cfg.Command}
	fmt.Fprintln(out)
	WriteLatencyTable(out, results, cfg, conds)
	if cfg.Out != "" {
		if err := writeLatency(cfg.Out, results, cfg, conds); err != nil {
			return results, err
		}
		fmt.Fprintf(out, "\nwrote %s\n", filepath.Join(cfg.Out, "LATENCY.md"))
	}
	for _, r := range results {
		if r.Err != nil {
			errs = append(errs, fmt.Errorf("%s at %s%s: %w", r.Design, r.Rate, waitNote(r.FetchMaxWait), r.Err))
		}
	}
	return results, errors.Join(errs...)
}

func waitNote(w time.Duration) string {
	if w == 0 {
		return ""
	}
	return fmt.Sprintf(" (FetchMaxWait %s)", w)
}

// latencyOne runs the design in its worker while this process produces the job's records at
// rate records a second, and returns the worker's report (its fold checked) and the rate the
// producer achieved.
func latencyOne(ctx context.Context, cfg LatencyConfig, info Info, job Job, db *pgxpool.Pool, cl *kgo.Client, rate float64, perKey int64) (Report, float64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		rep Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := runOne(ctx, cfg.Config, info, job, db)
		done <- result{rep, err}
	}()
	produced, perr := producePaced(ctx, cl, job.Topic, job.Keys, perKey, rate, done)
	if perr != nil {
		cancel()
		r := <-done
		return Report{}, 0, errors.Join(perr, r.err)
	}
	r := <-done
	return r.rep, produced, r.err
}

// producePaced writes Records(keys, perKey), in that order, at rate records a second (its
// client stamps each record as it is handed over), and returns the rate achieved; it stops
// early, with no error, if stop is ready (the worker ended).
func producePaced[T any](ctx context.Context, cl *kgo.Client, topic string, keys int, perKey int64, rate float64, stop chan T) (float64, error) {
	total := int64(keys) * perKey
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	start := time.Now()
	for i := int64(0); i < total; {
		due := min(int64(rate*time.Since(start).Seconds())+1, total)
		for ; i < due; i++ {
			r := record(int(i%int64(keys)), i/int64(keys)+1)
			r.Topic = topic
			wg.Add(1)
			cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
				defer wg.Done()
				if err != nil {
					mu.Lock()
					first = cmpErr(first, err)
					mu.Unlock()
				}
			})
		}
		select {
		case <-ctx.Done():
			wg.Wait()
			return 0, ctx.Err()
		case v := <-stop:
			stop <- v // the worker ended early: its result is read by the caller
			wg.Wait()
			return float64(i) / time.Since(start).Seconds(), nil
		case <-time.After(time.Millisecond):
		}
	}
	elapsed := time.Since(start)
	wg.Wait()
	if first != nil {
		return 0, fmt.Errorf("produce to %s: %w", topic, first)
	}
	return float64(total) / elapsed.Seconds(), nil
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// WriteLatencyTable writes the latency runs as a Markdown table, with the conditions above it.
func WriteLatencyTable(w io.Writer, results []LatencyResult, cfg LatencyConfig, c Conditions) {
	fmt.Fprintf(w, "%s, %s, %d CPUs; load average %s at the start, %s at the end\n",
		c.Date.Format("2006-01-02 15:04 UTC"), c.Go, c.CPUs, c.Start, c.End)
	fmt.Fprintf(w, "%d keys, %d partitions; producer linger %s; window: records produced from %s after the first commit, about %s\n",
		c.Keys, c.Partitions, cfg.Linger, cfg.Warmup, cfg.Duration)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| design | fetch max wait | rate asked | produced/s | steady records/s | p50 ms | p99 ms | max ms | commit p50 ms | commit p99 ms | records/tx | first commit s | RSS MiB | fold |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	for _, r := range results {
		wait := "default"
		if r.FetchMaxWait > 0 {
			wait = r.FetchMaxWait.String()
		}
		asked := fmt.Sprintf("%.0f", r.Target)
		if r.Rate.Fraction > 0 {
			asked = fmt.Sprintf("%.0f (%g%% of %s's %.0f)", r.Target, r.Rate.Fraction*100, r.Rate.base(r.Design), r.Throughput)
		}
		if r.Err != nil || r.Report.Latency == nil {
			fmt.Fprintf(w, "| %s | %s | %s | | did not count: %s | | | | | | | | | wrong or failed |\n", r.Design, wait, asked, strings.ReplaceAll(firstLine(fmt.Sprint(r.Err)), "|", "/"))
			continue
		}
		l := r.Report.Latency
		fmt.Fprintf(w, "| %s | %s | %s | %.0f | %.0f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %d | checked |\n", r.Design, wait, asked, r.Produced,
			l.Rate(), ms(l.P50), ms(l.P99), ms(l.Max), ms(l.CommitP50), ms(l.CommitP99), l.Batch(), r.Report.First.Seconds(), r.Report.RSS>>20)
	}
}

func writeLatency(dir string, results []LatencyResult, cfg LatencyConfig, c Conditions) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("# End-to-end latency at a steady rate\n\nGenerated by `baton bench latency -out DIR`; do not edit by hand.")
	if c.Command != "" {
		fmt.Fprintf(&b, " This run: `%s`.", c.Command)
	}
	b.WriteString("\n\n")
	WriteLatencyTable(&b, results, cfg, c)
	b.WriteString(latencyNotes)
	return os.WriteFile(filepath.Join(dir, "LATENCY.md"), []byte(b.String()), 0o644)
}

const latencyNotes = `
## Reading the table

- A producer in the driver process writes the job's records (the same fold as ` + "`baton bench`" + `)
  at the asked rate, paced every millisecond, while the design runs in its worker process on
  the same machine; its client stamps each record when it is handed over (CreateTime, in
  milliseconds: a latency can read up to 1 ms high). The worker notes each fetched record's
  stamp and, right after the transaction holding it returned from its commit, its latency.
  kafka-read's "commit" is the poll that returned the record.
- The window skips the start: only records produced **after the first commit plus the
  warm-up** count. **steady records/s** is the window's records over the time from its start
  to its last commit; below the asked rate, the design did not keep up and its latencies grow
  with the run.
- **rate asked** "P% of D's N" is P percent of design D's throughput (the design's own, or
  for kafka-read baton-fast's, unless the rate names one: ` + "`50%baton-fast`" + `), measured in
  the same command just before as ` + "`baton bench`" + ` does (a pre-produced topic, from the
  client's start to the last commit). A design sharing the machine with a producer runs
  slower than that: **produced/s** says what the producer achieved, **steady records/s**
  what the design did.
- **commit p50/p99** are of the window's transactions, begin to commit (the sink's Apply,
  the handler inside it); **records/tx** is the mean batch. **RSS** includes the timing's own
  memory: the stamps of the records fetched and not yet committed, and 8 bytes per record of
  the window.

## What sets the floor

A record's latency is the sum of:

1. the producer's linger (` + "`-linger`" + `) and the broker appending the batch;
2. the fetch: a consumer's fetch returns as soon as the broker holds any byte it asks for
   (kgo.FetchMinBytes 1), so at a steady rate it waits about nothing; kgo.FetchMaxWait ("default": 100 ms
   in Baton's consumer, franz-go's 5 s in kafka-read) only bounds a fetch when no record arrives
   at all. The
   rows with a lower fetch max wait show whether it matters here;
3. decoding, and the consumer handing the partition's records to its worker: a worker
   coalesces what is queued for it into one batch of at most MaxInflightPerPartition (1000)
   records, so a batch holds what arrived while the previous one committed;
4. the transaction: begin, the handler's statements, the fence, commit (PostgreSQL's commit
   waits for its WAL flush). **commit p50** is this part; at a steady rate most of the rest is
   waiting for the previous batch of the same partition to commit.

The end-to-end p50 minus the commit p50 is what Kafka and the queueing add. kafka-read, which
writes nothing, is the floor of the first two on this machine. On a 2-core machine shared by
the broker, the database, the producer and the consumer, CPU queueing adds to every step.
`
