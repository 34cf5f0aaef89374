package bench

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Table is the fold's table, in the run's schema.
const Table = "fold"

// FoldColumns are the fold's columns with their PostgreSQL types, in table order.
var FoldColumns = [][2]string{{"key", "text"}, {"n", "bigint"}, {"total", "bigint"}, {"first", "bigint"}, {"last", "bigint"}, {"bad", "bigint"}}

// FoldSet is the DO UPDATE SET clause of the fold (the table aliased t): correct for one
// record (n = 1) and for rows that [MergeFold] combined.
const FoldSet = `n = t.n + excluded.n, total = t.total + excluded.total, last = excluded.last,
	bad = t.bad + excluded.bad + (excluded.first <> t.last + 1)::int`

// FoldUpsert applies one record ($1 key, $2 value) to the fold: the statement a handler
// writing one row per record runs.
const FoldUpsert = `INSERT INTO ` + Table + ` AS t (key, n, total, first, last, bad) VALUES ($1, 1, $2, $2, $2, 0)
	ON CONFLICT (key) DO UPDATE SET ` + FoldSet

// FoldUnnest applies rows given as six arrays (one per column of [FoldColumns]), no key
// twice: the set-based statement.
const FoldUnnest = `INSERT INTO ` + Table + ` AS t (key, n, total, first, last, bad)
	SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[])
	ON CONFLICT (key) DO UPDATE SET ` + FoldSet

// FoldSetSQLite is [FoldSet] in SQLite's dialect (a comparison is already 0 or 1).
const FoldSetSQLite = `n = t.n + excluded.n, total = t.total + excluded.total, last = excluded.last,
	bad = t.bad + excluded.bad + (excluded.first <> t.last + 1)`

// FoldTableSQLite creates the fold table in an SQLite database.
const FoldTableSQLite = `CREATE TABLE IF NOT EXISTS ` + Table + ` (key TEXT PRIMARY KEY, n INTEGER NOT NULL,
	total INTEGER NOT NULL, first INTEGER NOT NULL, last INTEGER NOT NULL, bad INTEGER NOT NULL)`

// FoldRow is one record as a fold row: key, n, total, first, last, bad.
func FoldRow(key string, v int64) []any { return []any{key, int64(1), v, v, v, int64(0)} }

// MergeFold folds row (a later record, or merged records, of the same key) into into.
func MergeFold(into, row []any) {
	if row[3].(int64) != into[4].(int64)+1 {
		into[5] = into[5].(int64) + 1
	}
	into[1] = into[1].(int64) + row[1].(int64)
	into[2] = into[2].(int64) + row[2].(int64)
	into[4] = row[4]
	into[5] = into[5].(int64) + row[5].(int64)
}

// Value parses a record's value, the key's sequence number.
func Value(v []byte) (int64, error) {
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("record value %q: %w", v, err)
	}
	return n, nil
}

// Job is what one worker process runs: one design over one topic, into the fold table of
// one schema. It travels as JSON in the worker's -job flag.
type Job struct {
	Design     string        `json:"design"`
	Brokers    []string      `json:"brokers"`
	Topic      string        `json:"topic"`
	Partitions int           `json:"partitions"`
	Group      string        `json:"group"`
	Postgres   string        `json:"postgres"`
	Schema     string        `json:"schema"`
	Redis      string        `json:"redis,omitempty"`
	Records    int64         `json:"records"` // the topic's records; every one must be applied
	Keys       int           `json:"keys"`
	Conns      int           `json:"conns,omitempty"` // the ceiling's connections
	Timeout    time.Duration `json:"timeout"`
	Profile    string        `json:"profile,omitempty"` // a directory: the worker writes a CPU profile of its run there
	SQLite     string        `json:"sqlite,omitempty"`  // the SQLite designs' database file (created by the worker)
	// Latency: the worker times every record from its produce timestamp to the commit of the
	// batch holding it ([Report.Latency]), over the records produced Warmup or more after its
	// first commit. Set by 'baton bench latency', whose producer writes while the design runs.
	Latency bool          `json:"latency,omitempty"`
	Warmup  time.Duration `json:"warmup,omitempty"`
	FetchSettings
}

// FetchSettings are a consumer design's fetch options: when positive, the kgo options of
// those names (franz-go's defaults: 5s, 50 MiB, 1 MiB; Baton keeps them).
type FetchSettings struct {
	FetchMaxWait           time.Duration `json:"fetch_max_wait,omitempty"`
	FetchMaxBytes          int32         `json:"fetch_max_bytes,omitempty"`
	FetchMaxPartitionBytes int32         `json:"fetch_max_partition_bytes,omitempty"`
}

// RedisKey is the Redis hash holding key's fold in the redis- designs. Its hash tag
// {group/topic} is the one redisfence gives the job's fences (redisfence.HashTag escapes only
// % { } / :, which the bench's group and topic names never contain), so that each batch's
// keys and its fence share a hash slot, as Redis Cluster requires of one script.
func (j Job) RedisKey(key string) string {
	return "baton-bench:fold:{" + j.Group + "/" + j.Topic + "}:" + key
}

// RedisFields are the fields of a fold's hash, in the order of [FoldColumns] after the key.
var RedisFields = []string{"n", "total", "first", "last", "bad"}

// PerKey is the number of records of each key.
func (j Job) PerKey() int64 { return j.Records / int64(j.Keys) }

// Pool connects to the job's database with the run's schema as search_path and at most
// conns connections (never more than MaxConns), all of them opened before it returns ([Warm]):
// a design's setup, not its run, pays for connecting (each one a SCRAM exchange, whose key
// derivation is CPU the designs would otherwise spend in their timed run).
func (j Job) Pool(ctx context.Context, conns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(j.Postgres)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = j.Schema
	cfg.MaxConns = int32(min(max(conns, 1), MaxConns))
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := Warm(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// MaxConns bounds a design's connections: a pool of one connection per partition would
// exceed PostgreSQL's max_connections (100 by default, shared) at hundreds of partitions.
const MaxConns = 64

// Warm opens the pool's connections (all it may hold) before the run is timed: connecting is
// setup, like migrating, and a cold pool would charge every new backend to the first
// transactions (the claims of a consumer's first assignment).
func Warm(ctx context.Context, pool *pgxpool.Pool) error {
	conns := make([]*pgxpool.Conn, 0, pool.Config().MaxConns)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	var mu sync.Mutex
	var wg sync.WaitGroup
	var first error
	for range pool.Config().MaxConns {
		wg.Go(func() {
			c, err := pool.Acquire(ctx)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				first = cmpErr(first, err)
				return
			}
			conns = append(conns, c)
		})
	}
	wg.Wait()
	if first == nil {
		first = conns[0].Ping(ctx)
	}
	return first
}

// Report is what a worker prints, as one JSON line on stdout, when its design applied every
// record.
type Report struct {
	Design  string        `json:"design"`
	Records int64         `json:"records"`
	Wall    time.Duration `json:"wall"`    // Recorder.Start (before the Kafka client starts: group join included) to the last record committed
	Batches int           `json:"batches"` // transactions
	P50     time.Duration `json:"p50"`     // of one transaction (a batch, a row, a chunk)
	P99     time.Duration `json:"p99"`
	RSS     int64         `json:"rss"` // the worker's peak resident set (VmHWM) since Recorder.Start, bytes
	// First is Recorder.Start to the first transaction's commit: for a consumer, joining the
	// group, claiming, the first fetch and the first batch.
	First time.Duration `json:"first"`
	// Fetched is how many records the design's Kafka client decoded (0 where not counted):
	// above Records, records were fetched more than once (franz-go drops what it buffered
	// for a partition that is paused by the time it is polled, and fetches it again).
	Fetched int64 `json:"fetched,omitempty"`
	// Latency is the end-to-end latency over the steady window, with Job.Latency.
	Latency *Latency `json:"latency,omitempty"`
	// Phases are the moments before the first commit, from Recorder.Start, for the designs
	// that report them (Baton's consumers): see [Recorder.Phase].
	Phases []Phase `json:"phases,omitempty"`
}

// Rate is records per second.
func (r Report) Rate() float64 { return float64(r.Records) / r.Wall.Seconds() }

// Recorder counts what a design committed and times its transactions. Safe for concurrent use.
type Recorder struct {
	started atomic.Pointer[time.Time]
	first   atomic.Pointer[time.Time]
	want    int64
	applied atomic.Int64
	fetched atomic.Int64
	done    chan struct{}
	once    sync.Once
	mu      sync.Mutex
	lat     []time.Duration
	e2e     *latencies // with Job.Latency (latency.go)
	phases  []phaseAt  // under mu
}

// NewRecorder returns a recorder that is done after want records.
func NewRecorder(want int64) *Recorder { return &Recorder{want: want, done: make(chan struct{})} }

// Start marks the end of the design's setup (connections, migrations, data generated in
// memory): the run's wall time counts from here, and so does its peak RSS (Report.RSS): the
// setup's garbage is collected and returned to the OS, and the process's peak resident set
// reset (Linux >= 4.0), so that what the setup built and dropped (the ceilings' records)
// does not count. A design that never calls it is timed and measured from its launch.
func (r *Recorder) Start() {
	if r.started.Load() != nil {
		return
	}
	debug.FreeOSMemory()                                      // a collection, then the free pages returned
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) // resets VmHWM to VmRSS
	now := time.Now()
	r.started.CompareAndSwap(nil, &now)
}

// Committed records one committed transaction of n records that took d.
func (r *Recorder) Committed(n int64, d time.Duration) {
	if r.first.Load() == nil {
		now := time.Now()
		r.first.CompareAndSwap(nil, &now)
	}
	r.mu.Lock()
	r.lat = append(r.lat, d)
	r.mu.Unlock()
	if r.applied.Add(n) >= r.want {
		r.once.Do(func() { close(r.done) })
	}
}

// Fetched counts n records decoded by the design's Kafka client.
func (r *Recorder) Fetched(n int64) { r.fetched.Add(n) }

// Done is closed once every record was committed.
func (r *Recorder) Done() <-chan struct{} { return r.done }

// Applied is the number of records committed so far.
func (r *Recorder) Applied() int64 { return r.applied.Load() }

func (r *Recorder) quantiles() (n int, p50, p99 time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.lat) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(r.lat)
	slices.Sort(s)
	return len(s), s[len(s)/2], s[len(s)*99/100]
}

// Design runs one design until ctx ends, reporting each committed transaction to rec. It
// returns nil when ctx ended (the run stops it once rec is done), an error when it failed.
type Design func(ctx context.Context, job Job, rec *Recorder) error

// WorkerCommand is the hidden command of a binary that serves designs: 'baton bench-worker'
// and the peers binary take it as their first argument.
const WorkerCommand = "bench-worker"

// Serve is a worker process's main: it reads the job from -job, runs its design until every
// record was committed (or the job's timeout), stops it, and prints the [Report] on stdout.
func Serve(ctx context.Context, args []string, designs map[string]Design, stdout io.Writer) error {
	fs := flag.NewFlagSet(WorkerCommand, flag.ContinueOnError)
	js := fs.String("job", "", "the job, as JSON (written by 'baton bench')")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var job Job
	if err := json.Unmarshal([]byte(*js), &job); err != nil {
		return fmt.Errorf("bench worker: -job: %w", err)
	}
	design, ok := designs[job.Design]
	if !ok {
		return fmt.Errorf("bench worker: unknown design %q", job.Design)
	}
	rec := NewRecorder(job.Records)
	if job.Latency {
		rec.e2e = newLatencies(job.Warmup)
	}
	if job.Profile != "" {
		stop, err := startProfile(job)
		if err != nil {
			return err
		}
		defer stop()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- design(ctx, job, rec) }()
	timeout := time.NewTimer(job.Timeout)
	defer timeout.Stop()
	select {
	case <-rec.Done():
	case err := <-errc:
		if err == nil {
			err = errors.New("stopped early")
		}
		return fmt.Errorf("%s: %w (%d of %d records applied)", job.Design, err, rec.Applied(), job.Records)
	case <-timeout.C:
		cancel()
		<-errc
		return fmt.Errorf("%s: %d of %d records applied after %s", job.Design, rec.Applied(), job.Records, job.Timeout)
	case <-ctx.Done():
		<-errc
		return ctx.Err()
	}
	end := time.Now()
	if s := rec.started.Load(); s != nil {
		start = *s
	}
	wall := end.Sub(start)
	cancel()
	if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("%s: stopping: %w", job.Design, err)
	}
	n, p50, p99 := rec.quantiles()
	rep := Report{Design: job.Design, Records: rec.Applied(), Wall: wall, Batches: n, P50: p50, P99: p99, RSS: procStatus("VmHWM")}
	rep.Fetched = rec.fetched.Load()
	rep.Latency = rec.latency()
	rep.Phases = rec.phaseList()
	if f := rec.first.Load(); f != nil {
		rep.First = f.Sub(start)
	}
	return json.NewEncoder(stdout).Encode(rep)
}

// startProfile starts a CPU profile of the worker into the job's profile directory, named
// after the design and the time, and returns what stops it.
func startProfile(job Job) (func(), error) {
	name := fmt.Sprintf("%s-%s.pprof", strings.ReplaceAll(job.Design, "/", "-"), time.Now().UTC().Format("150405.000"))
	f, err := os.Create(filepath.Join(job.Profile, name))
	if err != nil {
		return nil, fmt.Errorf("bench worker: profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("bench worker: profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// procStatus returns a "kB" field of /proc/self/status in bytes, 0 where unavailable.
func procStatus(field string) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// Check verifies the fold in the job's schema: every one of keys keys at perKey records,
// summed, first to last, in order. It reads only the database.
func Check(ctx context.Context, db *pgxpool.Pool, keys int, perKey int64) error {
	var rows, wrong int
	var sample string
	err := db.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE n <> $1 OR total <> $1 * ($1 + 1) / 2 OR first <> 1 OR last <> $1 OR bad <> 0),
		coalesce(min(format('%s: n=%s total=%s first=%s last=%s bad=%s', key, n, total, first, last, bad))
			FILTER (WHERE n <> $1 OR total <> $1 * ($1 + 1) / 2 OR first <> 1 OR last <> $1 OR bad <> 0), '')
		FROM `+Table, perKey).Scan(&rows, &wrong, &sample)
	if err != nil {
		return fmt.Errorf("check: %w", err)
	}
	if rows != keys || wrong != 0 {
		return fmt.Errorf("check: %d keys (want %d), %d with a wrong fold (want n=%d, in order)%s", rows, keys, wrong, perKey, when(sample != "", "; e.g. "+sample))
	}
	return nil
}

// CheckSQLite is [Check] of the fold in the SQLite file at path, through the database/sql
// driver named "sqlite" (modernc.org/sqlite), which the binary running the harness registers
// (cmd/baton does, through sqlitefence): this package does not import it, so that the peers'
// module, which imports this package, does not need it.
func CheckSQLite(ctx context.Context, path string, keys int, perKey int64) error {
	db, err := sql.Open("sqlite", "file://"+path+"?mode=ro")
	if err != nil {
		return fmt.Errorf("check: %w", err)
	}
	defer db.Close()
	var rows, wrong int
	var sample string
	err = db.QueryRowContext(ctx, `SELECT count(*), count(*) FILTER (WHERE n <> ?1 OR total <> ?1 * (?1 + 1) / 2 OR first <> 1 OR last <> ?1 OR bad <> 0),
		coalesce(min(format('%s: n=%d total=%d first=%d last=%d bad=%d', key, n, total, first, last, bad))
			FILTER (WHERE n <> ?1 OR total <> ?1 * (?1 + 1) / 2 OR first <> 1 OR last <> ?1 OR bad <> 0), '')
		FROM `+Table, perKey).Scan(&rows, &wrong, &sample)
	if err != nil {
		return fmt.Errorf("check: %w", err)
	}
	if rows != keys || wrong != 0 {
		return fmt.Errorf("check: %d keys (want %d), %d with a wrong fold (want n=%d, in order)%s", rows, keys, wrong, perKey, when(sample != "", "; e.g. "+sample))
	}
	return nil
}

// CheckTwins is [Check] of the README's program in the SQLite file at path: every one of keys
// keys (devices) in its twins table, with perKey updates and the last value, perKey, as its
// reading. It sees fewer faults than the fold (a reordering that ends on the last value
// passes), which the other designs' checks cover.
func CheckTwins(ctx context.Context, path string, keys int, perKey int64) error {
	db, err := sql.Open("sqlite", "file://"+path+"?mode=ro")
	if err != nil {
		return fmt.Errorf("check: %w", err)
	}
	defer db.Close()
	var rows, wrong int
	var sample string
	err = db.QueryRowContext(ctx, `SELECT count(*), count(*) FILTER (WHERE updates <> ?1 OR reading <> CAST(?1 AS TEXT)),
		coalesce(min(format('%s: updates=%d reading=%s', device, updates, reading)) FILTER (WHERE updates <> ?1 OR reading <> CAST(?1 AS TEXT)), '')
		FROM twins`, perKey).Scan(&rows, &wrong, &sample)
	if err != nil {
		return fmt.Errorf("check: %w", err)
	}
	if rows != keys || wrong != 0 {
		return fmt.Errorf("check: %d twins (want %d), %d wrong (want updates=%d, reading %d)%s", rows, keys, wrong, perKey, perKey, when(sample != "", "; e.g. "+sample))
	}
	return nil
}

// CheckFold is [Check] of folds read from elsewhere (Redis): folds maps each key ("k00000",
// ...) to its n, total, first, last, bad; a key missing from it is missing from the fold.
func CheckFold(keys int, perKey int64, folds map[string][]int64) error {
	wrong, sample := 0, ""
	for k := range keys {
		key := fmt.Sprintf("k%05d", k)
		f, ok := folds[key]
		if ok && len(f) == 5 && f[0] == perKey && f[1] == perKey*(perKey+1)/2 && f[2] == 1 && f[3] == perKey && f[4] == 0 {
			continue
		}
		wrong++
		if sample == "" {
			sample = fmt.Sprintf("%s: %v (n total first last bad)", key, f)
			if !ok {
				sample = key + ": missing"
			}
		}
	}
	if len(folds) != keys || wrong != 0 {
		return fmt.Errorf("check: %d keys (want %d), %d missing or with a wrong fold (want n=%d, in order)%s", len(folds), keys, wrong, perKey, when(sample != "", "; e.g. "+sample))
	}
	return nil
}

func when(ok bool, s string) string {
	if ok {
		return s
	}
	return ""
}

// Reset empties the fold table of the schema, creating it if needed.
func Reset(ctx context.Context, db *pgxpool.Pool) error {
	_, err := db.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+Table+` (key text PRIMARY KEY, n bigint NOT NULL,
		total bigint NOT NULL, first bigint NOT NULL, last bigint NOT NULL, bad bigint NOT NULL)`)
	if err == nil {
		_, err = db.Exec(ctx, `TRUNCATE `+Table)
	}
	return err
}
