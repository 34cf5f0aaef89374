package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/internal/secure"
)

// WorkerKafkaEnv prefixes the environment variables through which a worker process learns
// Config.WorkerKafka (secure.FromEnv).
const WorkerKafkaEnv = "BATON_CHAOS_KAFKA_"

// FaultKind names a fault the harness injects.
type FaultKind string

const (
	FaultFreeze        FaultKind = "freeze"         // SIGSTOP a worker at its next write, past its session timeout, then SIGCONT
	FaultDelay         FaultKind = "delay"          // SIGSTOP a worker inside a transaction before commit (PostgreSQL only)
	FaultKill          FaultKind = "kill"           // SIGKILL a worker, start a replacement
	FaultTerm          FaultKind = "term"           // SIGTERM a worker (graceful handover), start a replacement
	FaultStorm         FaultKind = "storm"          // members join and leave repeatedly
	FaultBrokerRestart FaultKind = "broker-restart" // stop and start the real broker
	FaultDBRestart     FaultKind = "db-restart"     // restart PostgreSQL
	FaultGroupDelete   FaultKind = "group-delete"   // stop every worker, delete the group, restart: the generation regresses
)

// The faults aimed at the group coordinator's and static membership's interleavings
// (faults_coord.go).
const (
	// SIGSTOP a writer at its next write, let another member take its partition over, restart
	// the broker (in a cluster: the group coordinator's broker, gracefully) and SIGCONT the
	// writer once the coordinator starts loading the group.
	FaultPausedBrokerRestart FaultKind = "paused-broker-restart"
	// The same with the coordinator's broker SIGKILLed in a cluster (Config.KafkaNodes >= 2):
	// the coordinator moves and loads the group on another broker; the killed one restarts.
	FaultCoordinatorKill FaultKind = "coordinator-kill"
	// Static members: a worker frozen at its next write is replaced by a new process with the
	// same group.instance.id (no rebalance: the same generation), then resumed and stopped.
	FaultStaticReplace FaultKind = "static-replace"
	// Commands routed to two destination topics, read by one receiver with one inbox: a worker
	// is paused past its session timeout and the applied commands are searched for a key
	// read out of order across the two topics.
	FaultTwoTopicInbox FaultKind = "two-topic-inbox"
)

// AllFaults lists the worker, broker and database kinds, in the order a bounded run cycles
// through them ("all").
var AllFaults = []FaultKind{FaultFreeze, FaultDelay, FaultKill, FaultTerm, FaultStorm, FaultBrokerRestart, FaultDBRestart, FaultGroupDelete}

// CoordFaults lists the coordinator and static-membership kinds. FaultCoordinatorKill needs a
// cluster (Config.KafkaNodes).
var CoordFaults = []FaultKind{FaultPausedBrokerRestart, FaultCoordinatorKill, FaultStaticReplace, FaultTwoTopicInbox}

// EveryFault is AllFaults, CoordFaults and TopicFaults ("every").
var EveryFault = append(append(append([]FaultKind(nil), AllFaults...), CoordFaults...), TopicFaults...)

// ParseFaults parses a comma-separated list of kinds ("all" for the worker, broker and
// database kinds, "every" for those, the coordinator and static-membership kinds and the topic
// faults; the network kinds, NetFaults and MinorityFaults, are named one by one). A kind
// followed by "*N" counts N times ("freeze*30"): the schedule draws it N times as often.
func ParseFaults(s string) ([]FaultKind, error) {
	if s == "" || s == "all" {
		return append([]FaultKind(nil), AllFaults...), nil
	}
	if s == "every" {
		return append([]FaultKind(nil), EveryFault...), nil
	}
	var (
		out     []FaultKind
		named   []FaultKind
		weights []int
	)
	for _, f := range strings.Split(s, ",") {
		name, weight := strings.TrimSpace(f), 1
		if n, w, found := strings.Cut(name, "*"); found {
			var err error
			if weight, err = strconv.Atoi(strings.TrimSpace(w)); err != nil || weight < 1 || weight > maxFaultWeight {
				return nil, fmt.Errorf("chaos: fault %q: the weight after '*' must be a whole number from 1 to %d", f, maxFaultWeight)
			}
			name = strings.TrimSpace(n)
		}
		k := FaultKind(name)
		ok := false
		for _, a := range EveryFault {
			ok = ok || a == k
		}
		ok = ok || slices.Contains(FailoverFaults, k) || slices.Contains(NetFaults, k) || slices.Contains(ShardFaults, k) || slices.Contains(MinorityFaults, k)
		if !ok {
			return nil, fmt.Errorf("chaos: unknown fault %q", f)
		}
		named = append(named, k)
		weights = append(weights, weight)
	}
	// Round r holds every kind weighted above r, in the order named: each kind comes once
	// before any comes again, and the schedule's first pass (the list in order) mixes them.
	for r := range slices.Max(weights) {
		for i, k := range named {
			if weights[i] > r {
				out = append(out, k)
			}
		}
	}
	return out, nil
}

// maxFaultWeight bounds a kind's weight in a fault list ("freeze*30").
const maxFaultWeight = 1000

// Config configures a chaos run.
type Config struct {
	Mode       Mode
	Workers    int   // worker processes; default 3
	Partitions int32 // default 12
	// App, if set, is the application run instead of the built-in Workload: its topics, its
	// consumers in the workers, its input and its invariants (see [App]). Binary must run a
	// program that hands the same App to [RunWorker].
	App       App
	Workload  Workload
	Rate      int // records produced per second; default 2000
	Faults    []FaultKind
	NumFaults int // faults to inject; default len(Faults)*3
	// For, if positive, bounds the time spent injecting faults: no fault starts after it (a
	// soak stopped at a deadline still settles and gets its verdict).
	For    time.Duration
	Seed   int64         // picks targets and order
	Settle time.Duration // bound for applying everything after the last fault; default 90s

	Brokers []string
	// Kafka are extra client options for the harness's own clients (creating topics, producing
	// the workload, deleting the group): e.g. TLS and SASL as an admin principal.
	Kafka []kgo.Opt
	// WorkerKafka is how the worker processes reach a TLS/SASL listener; they get it through
	// the environment (WorkerKafkaEnv), as file paths, so no secret is on their command line.
	WorkerKafka secure.Kafka
	PostgresURL string // the workers' database (exactly one of PostgresURL, SQLitePath)
	SQLitePath  string
	RedisAddr   string // lock mode
	Group       string // default: unique per run
	Topic       string // default: unique per run; created with Partitions

	// Binary is the program run as each worker, with the arguments WorkerCommand and the
	// worker's flags, which it must hand to RunWorker; default: this executable.
	Binary         string
	SessionTimeout time.Duration // the workers'; default 3s
	DeployDir      string        // deploy/local, for broker and database restarts
	LogDir         string        // where each worker's stderr goes (baton-chaos-<id>-*.log); default os.TempDir()
	Progress       io.Writer     // live progress lines; nil for none
	// Watch, if set, is called with the run's database once it is ready (for live views).
	Watch func(DB)
	// Audit, if positive, runs the online auditor ('baton audit') beside the workers, a pass
	// every Audit, and adds what it found to the result (Result.Audit): see [AuditVerdict].
	Audit time.Duration

	// Static makes every worker a static member (group.instance.id "chaos-<worker id>");
	// implied by FaultStaticReplace.
	Static bool
	// WorkerEnv is added to every worker's environment (consumer/chaos passes the user
	// program's own arguments to its workers this way).
	WorkerEnv []string
	// KafkaNodes is the number of brokers when Brokers is deploy/local's cluster mode
	// (kafka.sh with KAFKA_NODES): restart faults then act on one node, and
	// FaultCoordinatorKill can run. 0 or 1: a single broker.
	KafkaNodes int
	// ScriptEnv is added to the environment of deploy/local's scripts (KAFKA_NODES,
	// BATON_STATE_DIR, ports), so restart faults reach the run's own services.
	ScriptEnv []string
	// LoadFiller is how many records the coordinator-loading faults first commit to the
	// group coordinator's log (a filler group's offsets), once per run, so that loading the
	// group takes long enough to be caught; 0: 20000, negative: none.
	LoadFiller int
	// ProveAsk makes the coordinator-loading faults count only when the frozen writer was seen
	// asking the loading coordinator for its currentness proof (the blind-proof mutant runs and
	// their controls, which need that very interleaving); otherwise the coordinator's load with
	// the writer resumed inside it counts, and the question, when seen, is evidence in the detail.
	ProveAsk bool

	// RedisSink, if set, is a Redis the built-in workload's fenced workers write through
	// (fence/redisfence) instead of the SQL database, which then keeps only the run's logs
	// (redis_sink.go). RedisRestart kills and restarts that server, for FaultRedisRestart.
	RedisSink    string
	RedisRestart func(context.Context) error

	// ShardURLs, if set, are PostgreSQL databases, home first, that the built-in workload's
	// fenced workers write through as one sharded sink (fence/shard); PostgresURL then keeps
	// only the run's logs (sharded.go).
	ShardURLs []string
	// Overlap, above 1, is how many faults may be in flight at once: the faults are drawn up
	// front from Seed (a schedule, schedule.go) and run on disjoint targets (what each kind
	// holds: Kinds). 0 or 1: one fault after another.
	Overlap int
	// Replay, if set, is a schedule to run (ReadSchedule, from a run's ScheduleFile) instead of
	// one drawn from Seed: the same kinds on the same targets in the same order, with its
	// Overlap unless Overlap is set. Faults and NumFaults are then the schedule's.
	Replay []ScheduledFault
	// ScheduleFile, if set, is where an overlapping or replayed run writes its schedule (JSON
	// lines) before its first fault.
	ScheduleFile string
}

// Result is a chaos run's outcome.
type Result struct {
	Config   Config
	Verdict  Verdict
	Faults   []Fault
	Started  time.Time
	Finished time.Time
	Settled  bool          // everything produced was applied within the Settle bound
	SettleIn time.Duration // how long applying the backlog took after the last fault
	Audit    *AuditVerdict // the auditor's findings, with Config.Audit (nil without)
	// ShardOutages are the shard-outage faults' proofs and measurements, in order.
	ShardOutages []ShardOutage
	// Schedule is the schedule an overlapping or replayed run ran (nil for one fault after
	// another); Concurrent counts the faults that ran while another was in flight, MaxInFlight
	// the most in flight at once.
	Schedule    []ScheduledFault
	Concurrent  int
	MaxInFlight int

	// acked counts, per topic, the records the harness's producer had acknowledged in each
	// second since Started (nil when not counted), for the report's backlog.
	acked map[string][]int64
}

// Fault is one injected fault, as logged.
type Fault struct {
	Kind   FaultKind
	Target string
	Detail string
	Start  time.Time
	End    time.Time
	Bit    bool // the fault provably happened (e.g. the frozen worker's takeover was seen)
	N      int  // its place in the run's schedule (Result.Schedule), from 1; 0 without one
}

// OK reports whether the run passed: the invariants held, the backlog was applied in time and
// the auditor, if it ran, found no violation. (A zombie write that committed after a takeover
// is a stale commit, which the invariants catch; one that committed without a takeover was no
// zombie's.)
func (r *Result) OK() bool {
	return r.Verdict.OK() && r.Settled && (r.Audit == nil || len(r.Audit.Violations) == 0)
}

type proc struct {
	id       string
	num      int    // the n of its id, wn
	slot     int    // the worker slot it fills (0..Workers-1), -1 for none
	instance string // group.instance.id, for a static member
	cmd      *exec.Cmd
	done     chan struct{}
	log      string // its stderr's file ("" if it could not be created)
}

type harness struct {
	cfg     Config
	db      DB
	rngMu   sync.Mutex
	rng     *rand.Rand // the run's; a scheduled fault draws from its own (faultSlot)
	progMu  sync.Mutex
	primeMu sync.Mutex
	mu      sync.Mutex
	procs   map[string]*proc
	nextID  int
	app     App      // Config.App, or builtin
	builtin *builtin // the built-in workload, when Config.App is nil
	groups  []string // the groups the workers join
	faults  []Fault
	t0      time.Time
	adm     *kadm.Client
	cl      *kgo.Client // the harness's client: creates topics, produces the workload
	logs    []string    // every worker's log file, in start order
	workers sync.WaitGroup
	primed  bool      // the coordinator's log was filled (LoadFiller)
	net     *netLayer // the workers' network namespaces, for the network faults (faults_net.go)
	shards  *shardRun // the sharded sink, with Config.ShardURLs (sharded.go)

	acks *ackCounter // the records the harness's client produced, as acknowledged
}

func (c *Config) defaults() error {
	if c.Workers <= 0 {
		c.Workers = 3
	}
	if c.Partitions <= 0 {
		c.Partitions = 12
	}
	if c.Rate <= 0 {
		c.Rate = 2000
	}
	if c.NumFaults < 0 {
		return errors.New("chaos: negative fault count")
	}
	if c.Settle <= 0 {
		c.Settle = 90 * time.Second
	}
	if c.SessionTimeout <= 0 {
		c.SessionTimeout = 3 * time.Second
	}
	if c.Mode == "" {
		c.Mode = Fenced
	}
	if c.Mode != Fenced || c.App != nil {
		c.Workload.CommandEvery = 0 // commands need the fence (outbox)
	}
	if c.LoadFiller == 0 {
		c.LoadFiller = 20000
	}
	// The topic faults need the fence's topic identity (fenced mode) and the built-in
	// workload's producer, which they pause: other runs skip them (the baselines have no
	// identity to hold a recreated or grown topic with; run there, they would fail for that
	// instead of the reasons they are run for). A run given only topic faults there is refused.
	if c.Mode != Fenced || c.App != nil {
		kept := c.Faults[:0:0]
		for _, f := range c.Faults {
			if !isTopicFault(f) {
				kept = append(kept, f)
			}
		}
		if len(kept) == 0 && len(c.Faults) > 0 {
			return fmt.Errorf("chaos: faults %v need the built-in workload in fenced mode", c.Faults)
		}
		c.Faults = kept
	}
	if len(c.Replay) > 0 {
		if len(c.Faults) == 0 {
			c.Faults = scheduleKinds(c.Replay)
		}
		c.NumFaults = len(c.Replay)
		if c.Overlap <= 0 {
			c.Overlap = c.Replay[0].Overlap
		}
		for _, s := range c.Replay {
			if !slices.Contains(c.Faults, s.Kind) {
				return fmt.Errorf("chaos: the schedule's fault %d is a %s, which this run does not inject", s.N, s.Kind)
			}
		}
	}
	if c.NumFaults == 0 && len(c.Faults) > 0 {
		c.NumFaults = 3 * len(c.Faults)
	}
	for _, f := range c.Faults {
		switch f {
		case FaultStaticReplace:
			c.Static = true
		case FaultTwoTopicInbox:
			if c.App != nil || c.Mode != Fenced || c.Workload.CommandEvery <= 0 {
				return fmt.Errorf("chaos: fault %s needs the built-in workload, fenced, with commands (CommandEvery > 0)", f)
			}
			c.Workload.CommandTopics = 2
		case FaultCoordinatorKill:
			if c.KafkaNodes < 2 {
				return fmt.Errorf("chaos: fault %s needs a cluster (KafkaNodes >= 2; deploy/local/kafka.sh with KAFKA_NODES=3)", f)
			}
		case FaultNetMinorityCoordinator:
			if c.KafkaNodes < 3 {
				return fmt.Errorf("chaos: fault %s needs a cluster of three brokers or more (KafkaNodes >= 3; deploy/local/kafka.sh with KAFKA_NODES=3)", f)
			}
		}
	}
	if err := c.redisDefaults(); err != nil {
		return err
	}
	if err := c.shardDefaults(); err != nil {
		return err
	}
	if c.App != nil && c.Mode == Lock {
		return errors.New("chaos: an application runs fenced or unfenced, not under the lock baseline")
	}
	if (c.PostgresURL == "") == (c.SQLitePath == "") {
		return errors.New("chaos: exactly one of a PostgreSQL URL and an SQLite path")
	}
	if len(c.Brokers) == 0 {
		return errors.New("chaos: no brokers")
	}
	if c.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		c.Binary = exe
	}
	suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
	if c.Group == "" {
		c.Group = "chaos-" + string(c.Mode) + "-" + suffix
	}
	if c.Topic == "" {
		c.Topic = "chaos-" + string(c.Mode) + "-" + suffix
	}
	for _, f := range c.Faults {
		if (f == FaultBrokerRestart || f == FaultDBRestart || f == FaultDBFailover || f == FaultPausedBrokerRestart || f == FaultCoordinatorKill || f == FaultNetMinorityCoordinator) && c.DeployDir == "" {
			return fmt.Errorf("chaos: fault %s needs DeployDir (deploy/local)", f)
		}
		if (f == FaultDBRestart || f == FaultDBFailover || f == FaultDelay) && c.PostgresURL == "" {
			return fmt.Errorf("chaos: fault %s needs PostgreSQL", f)
		}
	}
	if c.App != nil {
		return nil
	}
	return c.Workload.Validate()
}

// Run runs one chaos run: it creates the topic, starts the workers, produces the workload
// while injecting faults, waits until everything produced is applied (or the Settle bound
// passes), stops the workers and checks the invariants. db is the workers' database, already
// migrated with [Migrate].
func Run(ctx context.Context, cfg Config, db DB) (*Result, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	h := &harness{cfg: cfg, db: db, rng: rand.New(rand.NewSource(cfg.Seed)), procs: map[string]*proc{}, t0: time.Now()}
	h.acks = &ackCounter{t0: h.t0}
	// AlwaysRetryEOF: a restarting broker closes connections during the handshake, which
	// franz-go otherwise takes for a TLS/SASL misconfiguration and does not retry.
	// UnknownTopicRetries(-1): the run's topics exist (created, or recreated by topic-recreate,
	// by the harness), so UNKNOWN_TOPIC_OR_PARTITION is metadata not yet spread; franz-go's
	// default fails the records after 4 (seen on a loaded machine: the producer stopped).
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...), kgo.ProducerLinger(5 * time.Millisecond),
		kgo.RecordRetries(1 << 30), kgo.RequestRetries(1 << 20), kgo.RetryTimeout(5 * time.Minute), kgo.AlwaysRetryEOF(),
		kgo.UnknownTopicRetries(-1), kgo.WithHooks(h.acks)}, cfg.Kafka...)...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	h.adm, h.cl = kadm.NewClient(cl), cl
	h.app = cfg.App
	if h.app == nil {
		h.builtin = newBuiltin(cfg.Workload, cfg.Mode)
		h.app = h.builtin
	}
	if err := h.openNetFor(ctx); err != nil {
		return nil, err
	}
	defer h.closeNet()
	if err := h.openShards(ctx); err != nil {
		h.closeShards()
		return nil, err
	}
	defer h.closeShards()
	res, err := h.runApp(ctx, cl)
	if res != nil && h.shards != nil {
		res.ShardOutages = h.shards.outages
	}
	return res, err
}

func (h *harness) progress(format string, args ...any) {
	if h.cfg.Progress != nil {
		h.progMu.Lock()
		defer h.progMu.Unlock()
		fmt.Fprintf(h.cfg.Progress, "[%6.1fs] "+format+"\n", append([]any{time.Since(h.t0).Seconds()}, args...)...)
	}
}

func (h *harness) logFault(ctx context.Context, f Fault) {
	_ = h.db.Exec(context.WithoutCancel(ctx), `INSERT INTO chaos_faults (kind, target, detail, start_ms, end_ms) VALUES ($1, $2, $3, $4, $5)`,
		string(f.Kind), f.Target, f.Detail, f.Start.UnixMilli(), f.End.UnixMilli())
}

// start launches one worker process.
func (h *harness) start(ctx context.Context) error {
	_, err := h.startAs(ctx, "")
	return err
}

// startAs launches one worker process, a static member with the given group.instance.id if
// it is not empty (with Config.Static, each new worker gets its own otherwise).
func (h *harness) startAs(_ context.Context, instance string) (*proc, error) {
	h.mu.Lock()
	h.nextID++
	num := h.nextID
	id := fmt.Sprintf("w%d", num)
	h.mu.Unlock()
	if instance == "" && h.cfg.Static {
		instance = "chaos-" + id
	}
	args := workerArgs{
		ID: id, Mode: h.cfg.Mode, Brokers: h.cfg.Brokers, Group: h.cfg.Group, Topic: h.cfg.Topic,
		SessionTimeout: h.cfg.SessionTimeout, PostgresURL: h.cfg.PostgresURL, SQLitePath: h.cfg.SQLitePath,
		RedisAddr: h.cfg.RedisAddr, RedisSink: h.cfg.RedisSink, InstanceID: instance,
	}
	if h.shards != nil {
		args.ShardURLs = h.shards.urls
	}
	if h.builtin != nil {
		args.CommandEvery = h.builtin.w.CommandEvery
		args.CommandTopics = h.builtin.w.CommandTopics
	} else {
		args.App = h.app.Name()
	}
	argv, err := h.netWrap(id, append([]string{h.cfg.Binary, WorkerCommand}, args.argv()...))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the harness
	cmd.Env = append(append(os.Environ(), h.cfg.WorkerEnv...), h.netEnv()...)
	if h.cfg.WorkerKafka.Enabled() {
		cmd.Env = append(cmd.Env, h.cfg.WorkerKafka.Env(WorkerKafkaEnv)...)
	}
	cmd.Stdout = io.Discard
	logf, err := os.CreateTemp(h.cfg.LogDir, "baton-chaos-"+id+"-*.log")
	if err == nil {
		cmd.Stderr = logf
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("chaos: start worker: %w", err)
	}
	p := &proc{id: id, num: num, slot: -1, instance: instance, cmd: cmd, done: make(chan struct{})}
	if logf != nil {
		p.log = logf.Name()
	}
	h.workers.Add(1)
	go func() {
		defer h.workers.Done()
		_ = cmd.Wait()
		h.netExited(id)
		if logf != nil {
			_ = logf.Close()
		}
		close(p.done)
	}()
	h.mu.Lock()
	p.slot = h.freeSlot()
	h.procs[id] = p
	if p.log != "" {
		h.logs = append(h.logs, p.log)
	}
	h.mu.Unlock()
	return p, nil
}

func (h *harness) alive() []*proc {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []*proc
	for _, p := range h.procs {
		select {
		case <-p.done:
		default:
			out = append(out, p)
		}
	}
	// Stable order for a given seed.
	slices.SortFunc(out, func(a, b *proc) int { return strings.Compare(a.id, b.id) })
	return out
}

func (h *harness) stop(p *proc, sig syscall.Signal, wait time.Duration) {
	_ = p.cmd.Process.Signal(syscall.SIGCONT) // a frozen process cannot handle SIGTERM
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(wait):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	h.mu.Lock()
	delete(h.procs, p.id)
	h.mu.Unlock()
}

func (h *harness) stopAll() {
	for _, p := range h.alive() {
		h.stop(p, syscall.SIGTERM, 30*time.Second)
	}
	h.workers.Wait()
}

// pick picks a live worker at random; a scheduled fault gets the worker in its slot.
func (h *harness) pick(ctx context.Context) *proc {
	if s := faultSlotOf(ctx); s != nil && s.worker >= 0 {
		return h.slotProc(s.worker)
	}
	ps := h.alive()
	if len(ps) == 0 {
		return nil
	}
	return ps[h.intn(ctx, len(ps))]
}

// intn draws from a scheduled fault's own source, or the run's.
func (h *harness) intn(ctx context.Context, n int) int {
	if s := faultSlotOf(ctx); s != nil && s.rng != nil {
		return s.rng.Intn(n)
	}
	h.rngMu.Lock()
	defer h.rngMu.Unlock()
	return h.rng.Intn(n)
}

// pickWriter picks, among the live workers that committed a write in the last few seconds,
// one at random (a worker without partitions cannot be caught holding a write); any live
// worker if none did.
func (h *harness) pickWriter(ctx context.Context) *proc {
	if s := faultSlotOf(ctx); s != nil && s.worker >= 0 {
		return h.slotProc(s.worker)
	}
	ps := h.alive()
	var writers []*proc
	since := time.Now().Add(-5 * time.Second).UnixMilli()
	for _, p := range ps {
		var n int64
		err := h.db.QueryRow(ctx, `SELECT count(*) FROM chaos_attempts WHERE worker = $1 AND outcome = 'committed' AND at_ms >= $2`, p.id, since).Scan(&n)
		if err == nil && n > 0 {
			writers = append(writers, p)
		}
	}
	if len(writers) == 0 {
		return h.pick(ctx)
	}
	return writers[h.intn(ctx, len(writers))]
}

func (h *harness) inject(ctx context.Context, kind FaultKind) Fault {
	f := Fault{Kind: kind, Start: time.Now()}
	h.injectInto(ctx, &f)
	if f.End.IsZero() {
		f.End = time.Now()
	}
	return f
}

func (h *harness) injectInto(ctx context.Context, f *Fault) {
	kind := f.Kind
	st := h.cfg.SessionTimeout
	switch kind {
	case FaultFreeze:
		h.freeze(ctx, f, syscall.SIGUSR1, OutcomeFrozen)
	case FaultDelay:
		h.freeze(ctx, f, syscall.SIGUSR2, OutcomeDelayed)
	case FaultKill, FaultTerm:
		p := h.pick(ctx)
		if p == nil {
			f.Detail = "no worker alive"
			break
		}
		f.Target = p.id
		sig := syscall.SIGKILL
		if kind == FaultTerm {
			sig = syscall.SIGTERM
		}
		h.stop(p, sig, 30*time.Second)
		f.Bit = true
		if err := h.start(ctx); err != nil {
			f.Detail = err.Error()
		}
		sleep(ctx, st)
	case FaultStorm:
		f.Target = "group"
		for i := 0; i < 3; i++ {
			_ = h.start(ctx)
			_ = h.start(ctx)
			sleep(ctx, st/2)
			ps := h.alive()
			for _, p := range ps[len(ps)-2:] {
				h.stop(p, syscall.SIGKILL, 5*time.Second)
			}
			sleep(ctx, st/4)
		}
		for len(h.alive()) < h.cfg.Workers {
			_ = h.start(ctx)
		}
		f.Bit = true
		f.Detail = "3 rounds of 2 joins and 2 crashes"
		sleep(ctx, st)
	case FaultBrokerRestart:
		f.Target = "kafka"
		if h.cfg.KafkaNodes > 1 {
			n := 1 + h.intn(ctx, h.cfg.KafkaNodes)
			if s := faultSlotOf(ctx); s != nil && s.node > 0 {
				n = s.node
			}
			f.Target = fmt.Sprintf("kafka node %d", n)
			f.Bit, f.Detail = h.script(ctx, "kafka.sh", "node-restart", strconv.Itoa(n))
		} else {
			f.Bit, f.Detail = h.script(ctx, "kafka.sh", "restart")
		}
		sleep(ctx, st)
	case FaultPausedBrokerRestart, FaultCoordinatorKill:
		h.pausedCoordinatorMove(ctx, f)
	case FaultStaticReplace:
		h.staticReplace(ctx, f)
	case FaultTwoTopicInbox:
		h.twoTopicInbox(ctx, f)
	case FaultTopicRecreate:
		h.topicRecreate(ctx, f)
	case FaultTopicGrow:
		h.topicGrow(ctx, f)
	case FaultRedisRestart:
		h.redisRestart(ctx, f)
	case FaultDBFailover:
		h.dbFailover(ctx, f)
	case FaultShardOutage:
		h.shardOutage(ctx, f)
	case FaultNetBrokerCut, FaultNetDBCut, FaultNetFlaky, FaultNetHealMidTx:
		h.injectNet(ctx, f)
	case FaultNetMinorityCoordinator:
		h.minorityCoordinator(ctx, f)
	case FaultDBRestart:
		f.Target = "postgres"
		f.Bit, f.Detail = h.script(ctx, "postgres.sh", "restart")
		sleep(ctx, st)
	case FaultGroupDelete:
		groups := h.groups
		if len(groups) == 0 {
			groups = []string{h.cfg.Group}
		}
		f.Target = h.cfg.Group
		n := len(h.alive())
		for _, p := range h.alive() {
			h.stop(p, syscall.SIGTERM, 30*time.Second)
		}
		// Wait for each group to be empty, then delete it: the next generation starts at 1.
		deadline := time.Now().Add(30 * time.Second)
		deleted := 0
		for _, g := range groups {
			for time.Now().Before(deadline) {
				resp, err := h.adm.DeleteGroup(ctx, g)
				if err == nil && resp.Err == nil {
					deleted++
					break
				}
				sleep(ctx, 500*time.Millisecond)
			}
		}
		f.Bit = deleted == len(groups)
		if !f.Bit {
			f.Detail = fmt.Sprintf("%d of %d groups could not be deleted", len(groups)-deleted, len(groups))
		} else {
			f.Detail = fmt.Sprintf("all workers stopped, %d group(s) deleted, workers restarted", len(groups))
		}
		for i := 0; i < n; i++ {
			_ = h.start(ctx)
		}
		sleep(ctx, 2*st)
	}
}

// freeze arms a worker that is writing to freeze itself before its next write, waits until it
// is stopped, waits until another member has taken over one of its partitions (a claim or a
// write under a higher token), then continues it: its held write is now a zombie's.
//
// With SIGUSR2 and marker OutcomeDelayed the worker freezes inside its transaction instead; the
// takeover then waits for the database to end the held transaction.
func (h *harness) freeze(ctx context.Context, f *Fault, sig syscall.Signal, marker string) {
	p := h.pickWriter(ctx)
	if p == nil {
		f.Detail = "no worker alive"
		return
	}
	f.Target = p.id
	since := time.Now().UnixMilli()
	_ = p.cmd.Process.Signal(sig)
	var topic string
	var part int32
	var era, epoch int64
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := h.db.QueryRow(ctx, `SELECT topic, part, era, epoch FROM chaos_attempts WHERE worker = $1 AND outcome = $3 AND at_ms >= $2 ORDER BY id DESC LIMIT 1`,
			p.id, since, marker).Scan(&topic, &part, &era, &epoch)
		if err == nil && stopped(p.cmd.Process.Pid) {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			f.Detail = "worker did not reach a write (no partitions?)"
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
			return
		}
		sleep(ctx, 50*time.Millisecond)
	}
	// Takeover: a batch of that partition committed under a higher token by someone else.
	deadline = time.Now().Add(3*h.cfg.SessionTimeout + 30*time.Second)
	for {
		var n int64
		err := h.db.QueryRow(ctx, `SELECT count(*) FROM chaos_applied WHERE topic = $5 AND part = $1 AND worker <> $2 AND (era > $3 OR (era = $3 AND epoch > $4))`,
			part, p.id, era, epoch, topic).Scan(&n)
		if err == nil && n > 0 {
			f.Bit = true
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		sleep(ctx, 100*time.Millisecond)
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	f.Detail = fmt.Sprintf("%s holding %s/%d at token %d.%d", marker, topic, part, era, epoch)
	if !f.Bit {
		f.Detail += "; no takeover seen"
	}
	f.End = time.Now()
	sleep(ctx, h.cfg.SessionTimeout)
}

// stopped reports whether the process is in the stopped state.
func stopped(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && (s[i+2] == 'T' || s[i+2] == 't')
}

func (h *harness) script(ctx context.Context, name string, args ...string) (bool, string) {
	cmd := exec.CommandContext(ctx, filepath.Join(h.cfg.DeployDir, name), args...)
	cmd.Env = append(os.Environ(), h.cfg.ScriptEnv...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return false, fmt.Sprintf("%s %s: %v: %s", name, strings.Join(args, " "), err, lastLine(out))
	}
	return true, lastLine(out)
}

func lastLine(b []byte) string {
	s := strings.TrimSpace(string(b))
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}

// caughtUp reports whether the applied log reaches every listed partition's end offset (in
// the topic's current incarnation: batches under its latest reset's era or above).
func (h *harness) caughtUp(ctx context.Context, ends kadm.ListedOffsets) bool {
	got, err := h.appliedEnds(ctx)
	if err != nil {
		return false
	}
	done := true
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			done = false
			return
		}
		if last, ok := got[incKey{o.Topic, o.Partition}]; o.Offset > 0 && (!ok || last < o.Offset-1) {
			done = false
		}
	})
	return done
}

// appliedEnds returns, per partition, the last offset the applied log holds in the topic's
// current incarnation (batches under its latest reset's era or above); a partition with
// nothing applied there is absent.
func (h *harness) appliedEnds(ctx context.Context) (map[incKey]int64, error) {
	incs, err := incarnations(ctx, h.db)
	if err != nil {
		return nil, err
	}
	rows, err := h.db.Query(ctx, `SELECT topic, part, era, max(last_off) FROM chaos_applied GROUP BY topic, part, era`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	got := map[incKey]int64{}
	for rows.Next() {
		var k incKey
		var era, o int64
		if err := rows.Scan(&k.topic, &k.part, &era, &o); err != nil {
			return nil, err
		}
		if eras := incs[k]; len(eras) > 0 && era < slices.Max(eras) {
			continue // an earlier incarnation's
		}
		if cur, ok := got[k]; !ok || o > cur {
			got[k] = o
		}
	}
	return got, rows.Err()
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
