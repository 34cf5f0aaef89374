package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/batonhq/baton/cmd/baton/internal/bench"
)

// benchLatency is 'baton bench latency': end-to-end latency at a steady production rate.
func benchLatency(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench latency", "[flags]", `Measures end-to-end latency at a steady rate: for each design and rate, a producer in this
process writes the bench's records to a topic of their own at the rate (paced every
millisecond; its client stamps each record) while the design consumes them in a worker
process; the worker times every record from its produce timestamp to the return of the commit
of the transaction holding it. Prints, over the steady window (records produced from -warmup
after the design's first commit), records/s and p50/p99/max latency, with the commit's own
p50/p99 and the mean batch beside them; every run's fold is checked. With -out, writes
LATENCY.md there.

A rate is records a second (10000), or a percentage of a design's throughput measured in the
same command just before on a pre-produced topic of -records records: 50% takes the design's
own (kafka-read's: baton-fast's), 50%baton-fast names the design.
Designs: Baton's consumer designs and kafka-read (the floor: the broker's delivery alone).
`, stderr)
	var (
		cfg        bench.LatencyConfig
		rates      string
		waits      string
		designList string
	)
	benchServiceFlags(fs, &cfg.Config, &designList)
	fs.IntVar(&cfg.Records, "records", 200_000, "records of the topic a design's throughput is measured on (for a rate given as a percentage)")
	fs.IntVar(&cfg.Keys, "keys", 1000, "distinct keys")
	fs.IntVar(&cfg.Partitions, "partitions", 12, "topic partitions")
	fs.DurationVar(&cfg.Timeout, "timeout", 2*time.Minute, "bound of one design's run, beyond the production's length")
	fs.StringVar(&rates, "rates", "10000,50%", "production rates, comma-separated: records a second, or a percentage of the design's throughput")
	fs.DurationVar(&cfg.Warmup, "warmup", time.Second, "the window starts this long after the design's first commit")
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "about how long the window lasts (the producer writes for -warmup + -duration + 1s)")
	fs.StringVar(&waits, "fetch-max-wait", "100ms", "variants, comma-separated (empty: none): every design also runs at the first rate with this kgo.FetchMaxWait")
	fs.DurationVar(&cfg.Linger, "linger", 0, "the producer's kgo.ProducerLinger")
	benchFetchFlags(fs, &cfg.Fetch, false)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	for _, r := range splitList(rates) {
		rate, err := bench.ParseRate(r)
		if err != nil {
			return usageError{err: fmt.Errorf("-rates: %w", err)}
		}
		cfg.Rates = append(cfg.Rates, rate)
	}
	for _, w := range splitList(waits) {
		d, err := time.ParseDuration(w)
		if err != nil || d <= 0 {
			return usageError{err: fmt.Errorf("-fetch-max-wait %q: want positive durations", waits)}
		}
		cfg.FetchMaxWaits = append(cfg.FetchMaxWaits, d)
	}
	cfg.Conns = []int{1} // no ceiling runs here
	if err := benchFinish(&cfg.Config, designList, "baton bench latency", args, stdout); err != nil {
		return err
	}
	_, err := bench.RunLatency(ctx, cfg)
	return usageOr(err)
}

// usageOr returns err, as a usage error when the bench refused its configuration.
func usageOr(err error) error {
	if errors.Is(err, bench.ErrUsage) {
		return usageError{err: err}
	}
	return err
}

// benchScale is 'baton bench scale': records/s, p99 and peak RSS as partitions, keys and
// record size grow.
func benchScale(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench scale", "[flags]", `Measures how cost grows: the bench (every fold checked) at a default point, then with one
axis varied at a time from it: partitions (-axis-partitions), distinct keys (-axis-keys) and
record size (-axis-sizes, bytes of key, value and headers, padded with a header no design
reads). Prints records/s, the time to the first commit, p99 transaction latency and peak RSS
of each design at each point, and how long the run took; with -out, writes SCALE.md and
scale.svg there. Records per point stay modest (at most -max-bytes of records, never fewer
than one per key).
`, stderr)
	var (
		cfg                          bench.ScaleConfig
		designList, conns            string
		parts, keys, sizes, maxBytes string
	)
	benchServiceFlags(fs, &cfg.Config, &designList)
	fs.IntVar(&cfg.Records, "records", 100_000, "records of a point (at least one per key, at most -max-bytes)")
	fs.IntVar(&cfg.Keys, "keys", 1000, "distinct keys at the default point")
	fs.IntVar(&cfg.Partitions, "partitions", 12, "partitions at the default point")
	fs.IntVar(&cfg.Size, "size", 100, "bytes of a record at the default point")
	fs.StringVar(&parts, "axis-partitions", "12,96,512", "partition counts, comma-separated")
	fs.StringVar(&keys, "axis-keys", "1000,100000,1000000", "distinct key counts, comma-separated")
	fs.StringVar(&sizes, "axis-sizes", "100,1024,10240", "record sizes in bytes, comma-separated")
	fs.StringVar(&maxBytes, "max-bytes", "268435456", "bound of a point's records in bytes (records x size)")
	fs.StringVar(&conns, "conns", "4", "the ceiling's connection counts to try at each point (the best counts)")
	fs.DurationVar(&cfg.Timeout, "timeout", 5*time.Minute, "bound of one design's run")
	benchFetchFlags(fs, &cfg.Fetch, true)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var err error
	for _, a := range []struct {
		name string
		s    string
		to   *[]int
	}{{"-axis-partitions", parts, &cfg.AxisPartitions}, {"-axis-keys", keys, &cfg.AxisKeys}, {"-axis-sizes", sizes, &cfg.AxisSizes}, {"-conns", conns, &cfg.Conns}} {
		if *a.to, err = intList(a.s); err != nil {
			return usageError{err: fmt.Errorf("%s: %w", a.name, err)}
		}
	}
	if cfg.MaxBytes, err = strconv.ParseInt(maxBytes, 10, 64); err != nil || cfg.MaxBytes < 1 {
		return usageError{err: fmt.Errorf("-max-bytes %q: want a positive number of bytes", maxBytes)}
	}
	if err := benchFinish(&cfg.Config, designList, "baton bench scale", args, stdout); err != nil {
		return err
	}
	_, err = bench.RunScale(ctx, cfg)
	return usageOr(err)
}

// benchFetchFlags adds the flags of the consumer designs' fetch options (wait: with
// -fetch-max-wait too).
func benchFetchFlags(fs *flag.FlagSet, f *bench.FetchSettings, wait bool) {
	if wait {
		fs.DurationVar(&f.FetchMaxWait, "fetch-max-wait", 0, "Baton's designs' and kafka-read's kgo.FetchMaxWait (0: franz-go's 5s)")
	}
	fs.Func("fetch-max-bytes", "Baton's designs' and kafka-read's kgo.FetchMaxBytes (default: franz-go's 50 MiB)", func(s string) error {
		return positiveInt32(s, &f.FetchMaxBytes)
	})
	fs.Func("fetch-max-partition-bytes", "Baton's designs' and kafka-read's kgo.FetchMaxPartitionBytes (default: franz-go's 1 MiB)", func(s string) error {
		return positiveInt32(s, &f.FetchMaxPartitionBytes)
	})
}

func positiveInt32(s string, to *int32) error {
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil || n < 1 {
		return fmt.Errorf("%q: want a positive number of bytes", s)
	}
	*to = int32(n)
	return nil
}

// benchServiceFlags adds the flags the bench's modes share: the services, the designs, the
// output directory and profiling.
func benchServiceFlags(fs *flag.FlagSet, cfg *bench.Config, designs *string) {
	fs.StringVar(designs, "designs", "", "designs to run, comma-separated (default: the mode's)")
	fs.StringVar(&cfg.Postgres, "postgres", os.Getenv("BATON_POSTGRES_URL"), "PostgreSQL URL (default $BATON_POSTGRES_URL)")
	fs.StringVar(&cfg.Redis, "redis", os.Getenv("BATON_REDIS_ADDR"), "Redis address (default $BATON_REDIS_ADDR)")
	fs.Func("brokers", "Kafka seed brokers (default $BATON_KAFKA_BROKERS)", func(s string) error {
		cfg.Brokers = splitList(s)
		return nil
	})
	fs.StringVar(&cfg.Profile, "profile", "", "directory to write each worker's CPU profile and Kafka timeline to (none if empty)")
	fs.StringVar(&cfg.Out, "out", "", "directory to write the results to (none if empty)")
	cfg.Rounds = 1
}

// benchFinish completes cfg after parsing: brokers from the environment, the designs, the
// worker command and the progress output.
func benchFinish(cfg *bench.Config, designs, command string, args []string, stdout io.Writer) error {
	if len(cfg.Brokers) == 0 {
		cfg.Brokers = splitList(os.Getenv("BATON_KAFKA_BROKERS"))
	}
	cfg.Designs = splitList(designs)
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cfg.Self = []string{self}
	cfg.Progress = stdout
	cfg.RedisFold = redisFold{addr: cfg.Redis}
	cfg.Command = strings.TrimSpace(command + " " + strings.Join(args, " "))
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func intList(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}
