package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Overlapping faults: with Config.Overlap above 1 the faults are drawn up front from the seed
// (a schedule: kind, earliest start, the target it holds, a seed of its own), and up to Overlap
// of them run at once on disjoint targets; Config.Replay runs a given schedule instead. The
// schedule is written as JSON lines (Config.ScheduleFile, WriteSchedule) and printed in the
// progress, so a run can be replayed from it: the same kinds on the same targets in the same
// order, each fault's own choices drawn from its own seed, started as close to its offset as
// the faults before it allow.

// Hold is what a fault kind holds while it runs: the scheduler runs two faults at once only
// when what they hold is disjoint.
type Hold int

const (
	// HoldEverything: the group, the topic or every worker (group deletion, rebalance storms,
	// topic changes, static replacement): the fault runs alone.
	HoldEverything Hold = iota
	// HoldWorker: one worker, its process or its network links.
	HoldWorker
	// HoldBroker: one broker node (the broker, without a cluster).
	HoldBroker
	// HoldCoordinator: one worker and every broker node (the coordinator's node is found only
	// when the fault runs).
	HoldCoordinator
	// HoldDatabase: the workers' database.
	HoldDatabase
	// HoldRedisSink: the Redis the workers write through (Config.RedisSink).
	HoldRedisSink
	// HoldWorkerDatabase: one worker and the database (a fault proven by the other workers
	// committing while that worker cannot).
	HoldWorkerDatabase
	// HoldWorkerDatabaseBrokers: one worker, the database and every broker node (a fault
	// proven by the group keeping that worker and the others committing while it cannot, which
	// no fault of the brokers may stop meanwhile).
	HoldWorkerDatabaseBrokers
)

func (h Hold) String() string {
	switch h {
	case HoldWorker:
		return "a worker"
	case HoldBroker:
		return "a broker node"
	case HoldCoordinator:
		return "a worker and the brokers"
	case HoldDatabase:
		return "the database"
	case HoldRedisSink:
		return "the Redis sink"
	case HoldWorkerDatabase:
		return "a worker and the database"
	case HoldWorkerDatabaseBrokers:
		return "a worker, the database and the brokers"
	}
	return "everything (runs alone)"
}

// KindInfo describes a fault kind: what it holds while it runs and what it needs to run.
type KindInfo struct {
	Kind  FaultKind
	Holds Hold
	Needs string // "" when the default services (one broker, PostgreSQL) are enough
}

// kindTable is every fault kind: what it holds, and what it needs. A kind missing here holds
// everything.
var kindTable = []KindInfo{
	{FaultFreeze, HoldWorker, ""},
	{FaultDelay, HoldWorker, "PostgreSQL"},
	{FaultKill, HoldWorker, ""},
	{FaultTerm, HoldWorker, ""},
	{FaultStorm, HoldEverything, ""},
	{FaultBrokerRestart, HoldBroker, "deploy/local (-deploy)"},
	{FaultDBRestart, HoldDatabase, "deploy/local's PostgreSQL"},
	{FaultGroupDelete, HoldEverything, ""},
	{FaultPausedBrokerRestart, HoldCoordinator, "deploy/local (-deploy)"},
	{FaultCoordinatorKill, HoldCoordinator, "a cluster (-kafka-nodes 3, deploy/local's KAFKA_NODES=3)"},
	{FaultStaticReplace, HoldEverything, ""},
	{FaultTwoTopicInbox, HoldWorker, "fenced mode with commands (-command-every)"},
	{FaultTopicRecreate, HoldEverything, "fenced mode, the built-in workload"},
	{FaultTopicGrow, HoldEverything, "fenced mode, the built-in workload"},
	{FaultDBFailover, HoldDatabase, "a PostgreSQL standby (postgres.sh standby start) and the multi-host URL env prints"},
	{FaultNetBrokerCut, HoldWorker, "root, iproute2, PostgreSQL, a plaintext broker"},
	{FaultNetDBCut, HoldWorkerDatabaseBrokers, "root, iproute2, PostgreSQL, a plaintext broker"},
	{FaultNetFlaky, HoldWorker, "root, iproute2, PostgreSQL, a plaintext broker"},
	{FaultNetHealMidTx, HoldWorker, "root, iproute2, PostgreSQL, a plaintext broker"},
	{FaultRedisRestart, HoldRedisSink, "a Redis sink (consumer/chaos and the tests only)"},
	{FaultNetMinorityCoordinator, HoldEverything, "root, iproute2, iptables, cgroup v2, PostgreSQL, a plaintext broker, a cluster of three (-kafka-nodes 3)"},
	{FaultShardOutage, HoldWorkerDatabase, "a sharded sink (-shards) on deploy/local's postgres-shards.sh clusters"},
}

// Kinds lists every fault kind with what it holds and needs.
func Kinds() []KindInfo { return slices.Clone(kindTable) }

func holdOf(k FaultKind) Hold {
	for _, i := range kindTable {
		if i.Kind == k {
			return i.Holds
		}
	}
	return HoldEverything
}

// ScheduledFault is one fault of a schedule, as written in its file (one JSON object a line).
type ScheduledFault struct {
	N       int       `json:"n"`       // its place in the schedule, from 1
	Kind    FaultKind `json:"kind"`    //
	AtMS    int64     `json:"at_ms"`   // earliest start, after the first fault's
	Worker  int       `json:"worker"`  // the worker slot it acts on, from 1 (kinds that pick a worker)
	Node    int       `json:"node"`    // the broker node it restarts, from 1
	Holds   []string  `json:"holds"`   // what it holds: "worker N", "broker N", "database", "redis", "everything"
	Seed    int64     `json:"seed"`    // its own choices' seed
	Overlap int       `json:"overlap"` // the run's Overlap
}

// faultSlot is what a scheduled fault's context carries to the code that picks its targets.
type faultSlot struct {
	worker int // 0-based worker slot; -1: none given
	node   int // broker node; 0: none given
	rng    *rand.Rand
}

type faultSlotKey struct{}

func withFaultSlot(ctx context.Context, s *faultSlot) context.Context {
	return context.WithValue(ctx, faultSlotKey{}, s)
}

func faultSlotOf(ctx context.Context) *faultSlot {
	s, _ := ctx.Value(faultSlotKey{}).(*faultSlot)
	return s
}

// planSchedule draws n faults of the given kinds from seed: each kind once in the given order,
// then at random; offsets a random part of a session timeout apart; worker slots and broker
// nodes spread so that neighbouring faults, which may run together, hold different ones.
func planSchedule(seed int64, kinds []FaultKind, n, overlap, workers, nodes int, gap time.Duration) []ScheduledFault {
	rng := rand.New(rand.NewSource(seed))
	if nodes < 1 {
		nodes = 1
	}
	if overlap < 1 {
		overlap = 1
	}
	var out []ScheduledFault
	var at int64
	// spread picks one of n, avoiding the values used by the last few entries when it can.
	spread := func(n int, recent func(ScheduledFault) int) int {
		used := map[int]bool{}
		for i := len(out) - 1; i >= 0 && i >= len(out)-(overlap-1); i-- {
			used[recent(out[i])] = true
		}
		var free []int
		for v := 1; v <= n; v++ {
			if !used[v] {
				free = append(free, v)
			}
		}
		if len(free) == 0 {
			return 1 + rng.Intn(n)
		}
		return free[rng.Intn(len(free))]
	}
	for i := 0; i < n && len(kinds) > 0; i++ {
		k := kinds[i%len(kinds)]
		if i >= len(kinds) {
			k = kinds[rng.Intn(len(kinds))]
		}
		if i > 0 && gap > 0 {
			at += rng.Int63n(gap.Milliseconds() + 1)
		}
		s := ScheduledFault{N: i + 1, Kind: k, AtMS: at, Overlap: overlap}
		s.Worker = spread(max(workers, 1), func(o ScheduledFault) int { return o.Worker })
		s.Node = spread(nodes, func(o ScheduledFault) int { return o.Node })
		s.Seed = rng.Int63()
		s.Holds = holdsOf(k, s.Worker, s.Node, nodes)
		out = append(out, s)
	}
	return out
}

// holdsOf names what a fault of kind k on worker slot w and broker node holds.
func holdsOf(k FaultKind, w, node, nodes int) []string {
	worker := fmt.Sprintf("worker %d", w)
	switch holdOf(k) {
	case HoldWorker:
		return []string{worker}
	case HoldBroker:
		return []string{fmt.Sprintf("broker %d", node)}
	case HoldCoordinator:
		out := []string{worker}
		for n := 1; n <= max(nodes, 1); n++ {
			out = append(out, fmt.Sprintf("broker %d", n))
		}
		return out
	case HoldDatabase:
		return []string{"database"}
	case HoldRedisSink:
		return []string{"redis"}
	case HoldWorkerDatabase:
		return []string{worker, "database"}
	case HoldWorkerDatabaseBrokers:
		out := []string{worker, "database"}
		for n := 1; n <= max(nodes, 1); n++ {
			out = append(out, fmt.Sprintf("broker %d", n))
		}
		return out
	}
	return []string{"everything"}
}

// conflicts reports whether s may not start beside the faults in flight: what it holds meets
// what one of them holds, or it would leave no worker unheld to take a held worker's
// partitions over.
func conflicts(inFlight []ScheduledFault, s ScheduledFault, workers int) bool {
	held := map[string]bool{}
	for _, f := range inFlight {
		for _, x := range f.Holds {
			held[x] = true
		}
	}
	if len(inFlight) > 0 && slices.Contains(s.Holds, "everything") || held["everything"] {
		return true
	}
	for _, x := range s.Holds {
		if held[x] {
			return true
		}
	}
	if !slices.ContainsFunc(s.Holds, func(x string) bool { return strings.HasPrefix(x, "worker ") }) {
		return false
	}
	n := 0
	for x := range held {
		if strings.HasPrefix(x, "worker ") {
			n++
		}
	}
	for _, x := range s.Holds {
		if strings.HasPrefix(x, "worker ") {
			n++
		}
	}
	return n >= workers && len(inFlight) > 0
}

// runOpts is how runSchedule runs a schedule.
type runOpts struct {
	overlap  int
	workers  int
	deadline time.Duration // no fault starts after it (0: none)
	progress func(format string, args ...any)
}

// runSchedule runs the schedule: each fault in order, no earlier than its offset, once fewer
// than overlap faults are in flight and none of them holds what it holds. inject runs one fault
// and returns it as it happened (with its N). It returns the faults in the order it started
// them (the schedule's), once every fault it started ended.
func runSchedule(ctx context.Context, sched []ScheduledFault, o runOpts, inject func(context.Context, ScheduledFault) Fault) []Fault {
	if o.overlap < 1 {
		o.overlap = 1
	}
	if o.progress == nil {
		o.progress = func(string, ...any) {}
	}
	start := time.Now()
	var (
		mu       sync.Mutex
		inFlight = map[int]ScheduledFault{}
		out      []Fault
		wg       sync.WaitGroup
	)
	freed := make(chan struct{}, len(sched)+1)
	flight := func() []ScheduledFault {
		var fs []ScheduledFault
		for _, f := range inFlight {
			fs = append(fs, f)
		}
		return fs
	}
	defer wg.Wait()
	for i, s := range sched {
		if ctx.Err() != nil {
			break
		}
		if d := time.Until(start.Add(time.Duration(s.AtMS) * time.Millisecond)); d > 0 {
			sleep(ctx, d)
		}
		for ctx.Err() == nil {
			if o.deadline > 0 && time.Since(start) >= o.deadline {
				break
			}
			mu.Lock()
			ok := len(inFlight) < o.overlap && !conflicts(flight(), s, o.workers)
			if ok {
				inFlight[s.N] = s
			}
			n := len(inFlight)
			mu.Unlock()
			if ok {
				o.progress("fault %d/%d %s on %s starts (%d in flight)", s.N, len(sched), s.Kind, strings.Join(s.Holds, ","), n)
				wg.Add(1)
				go func() {
					defer wg.Done()
					f := inject(ctx, s)
					mu.Lock()
					delete(inFlight, s.N)
					out = append(out, f)
					mu.Unlock()
					freed <- struct{}{}
				}()
				break
			}
			select {
			case <-ctx.Done():
			case <-freed:
			case <-time.After(time.Second): // the deadline
			}
		}
		if o.deadline > 0 && time.Since(start) >= o.deadline {
			o.progress("fault injection stopped after %s: %d of %d scheduled faults started", o.deadline, i, len(sched))
			break
		}
	}
	wg.Wait()
	sort.Slice(out, func(i, j int) bool { return out[i].N < out[j].N })
	return out
}

// overlapStats returns how many faults ran while another was in flight (their intervals
// intersect) and the most in flight at once.
func overlapStats(faults []Fault) (concurrent, maxInFlight int) {
	type ev struct {
		at    time.Time
		delta int
	}
	var evs []ev
	for i, f := range faults {
		evs = append(evs, ev{f.Start, 1}, ev{f.End, -1})
		for j, g := range faults {
			if i != j && f.Start.Before(g.End) && g.Start.Before(f.End) {
				concurrent++
				break
			}
		}
	}
	// Ends before starts at the same instant: touching intervals do not overlap.
	sort.Slice(evs, func(i, j int) bool {
		if evs[i].at.Equal(evs[j].at) {
			return evs[i].delta < evs[j].delta
		}
		return evs[i].at.Before(evs[j].at)
	})
	n := 0
	for _, e := range evs {
		n += e.delta
		maxInFlight = max(maxInFlight, n)
	}
	return concurrent, maxInFlight
}

// WriteSchedule writes a schedule as JSON lines, one fault a line.
func WriteSchedule(w io.Writer, sched []ScheduledFault) error {
	enc := json.NewEncoder(w)
	for _, s := range sched {
		if err := enc.Encode(s); err != nil {
			return err
		}
	}
	return nil
}

// ReadSchedule reads a schedule written by WriteSchedule (a run's schedule file), for
// Config.Replay. Its faults must be numbered 1, 2, ... in order and name known kinds.
func ReadSchedule(r io.Reader) ([]ScheduledFault, error) {
	var out []ScheduledFault
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var s ScheduledFault
		dec := json.NewDecoder(strings.NewReader(sc.Text()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&s); err != nil {
			return nil, fmt.Errorf("chaos: schedule line %d: %w", line, err)
		}
		if !knownKind(s.Kind) {
			return nil, fmt.Errorf("chaos: schedule line %d: unknown fault kind %q", line, s.Kind)
		}
		if s.N != len(out)+1 || s.AtMS < 0 || s.Worker < 1 || s.Node < 1 || len(s.Holds) == 0 {
			return nil, fmt.Errorf("chaos: schedule line %d: want fault %d with an offset, a worker, a node and its holds", line, len(out)+1)
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New("chaos: empty schedule")
	}
	return out, nil
}

// knownKind reports whether k names one fault kind.
func knownKind(k FaultKind) bool {
	if slices.ContainsFunc(kindTable, func(i KindInfo) bool { return i.Kind == k }) {
		return true
	}
	_, err := ParseFaults(string(k))
	return err == nil && k != "" && k != "all" && k != "every" && !strings.Contains(string(k), ",")
}

// scheduleKinds returns the kinds of a schedule, each once, in first-seen order.
func scheduleKinds(sched []ScheduledFault) []FaultKind {
	var out []FaultKind
	for _, s := range sched {
		if !slices.Contains(out, s.Kind) {
			out = append(out, s.Kind)
		}
	}
	return out
}

// freeSlot returns the lowest worker slot no live worker fills, or -1 (an extra worker, such
// as a storm's). h.mu is held.
func (h *harness) freeSlot() int {
	filled := map[int]bool{}
	for _, p := range h.procs {
		if !exited(p) {
			filled[p.slot] = true
		}
	}
	for s := 0; s < h.cfg.Workers; s++ {
		if !filled[s] {
			return s
		}
	}
	return -1
}

// slotProc returns the live worker in slot s (the newest, while a static member's replacement
// runs beside it), or, if none fills it, gives it the oldest live worker that fills none.
func (h *harness) slotProc(s int) *proc {
	h.mu.Lock()
	defer h.mu.Unlock()
	var in, extra *proc
	for _, p := range h.procs {
		switch {
		case exited(p):
		case p.slot == s && (in == nil || p.num > in.num):
			in = p
		case p.slot < 0 && (extra == nil || p.num < extra.num):
			extra = p
		}
	}
	if in == nil && extra != nil {
		extra.slot, in = s, extra
	}
	return in
}

func exited(p *proc) bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// injectScheduled runs the run's schedule (Config.Replay, or one drawn from the seed) with up
// to Config.Overlap faults in flight, and returns it.
func (h *harness) injectScheduled(ctx context.Context) []ScheduledFault {
	cfg := h.cfg
	sched := cfg.Replay
	if len(sched) == 0 {
		sched = planSchedule(cfg.Seed, cfg.Faults, cfg.NumFaults, cfg.Overlap, cfg.Workers, max(cfg.KafkaNodes, 1), cfg.SessionTimeout)
	}
	if cfg.ScheduleFile != "" {
		if err := writeScheduleFile(cfg.ScheduleFile, sched); err != nil {
			h.progress("schedule file %s: %v", cfg.ScheduleFile, err)
		}
	}
	for _, s := range sched {
		b, _ := json.Marshal(s)
		h.progress("schedule: %s", b)
	}
	o := runOpts{overlap: cfg.Overlap, workers: cfg.Workers, deadline: cfg.For, progress: h.progress}
	h.faults = runSchedule(ctx, sched, o, func(ctx context.Context, s ScheduledFault) Fault {
		fs := &faultSlot{worker: s.Worker - 1, node: s.Node, rng: rand.New(rand.NewSource(s.Seed))}
		f := h.inject(withFaultSlot(ctx, fs), s.Kind)
		f.N = s.N
		h.logFault(ctx, f)
		h.progress("fault %d/%d %-14s %-10s bit=%v %s (%.1fs)", s.N, len(sched), f.Kind, f.Target, f.Bit, f.Detail, f.End.Sub(f.Start).Seconds())
		return f
	})
	return sched
}

func writeScheduleFile(name string, sched []ScheduledFault) error {
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	if err := WriteSchedule(f, sched); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// EveryFor returns the kinds of "every" (EveryFault, FailoverFaults and NetFaults) that a run
// on these services can inject, and the ones it cannot with why: the coordinator kill needs a
// cluster (kafkaNodes >= 2), the failover a PostgreSQL URL naming a primary and its standby, the
// network kinds root and iproute2 (NetSupported).
func EveryFor(kafkaNodes int, postgresURL string) (kinds []FaultKind, skipped map[FaultKind]string) {
	skipped = map[FaultKind]string{}
	nodes, err := pgNodes(postgresURL)
	standby := err == nil && len(nodes) >= 2
	net := NetSupported()
	for _, k := range slices.Concat(EveryFault, FailoverFaults, NetFaults) {
		switch {
		case k == FaultCoordinatorKill && kafkaNodes < 2:
			skipped[k] = "needs a cluster (-kafka-nodes)"
		case k == FaultDBFailover && !standby:
			skipped[k] = "needs a PostgreSQL URL naming a primary and its standby"
		case isNetFault(k) && net != "":
			skipped[k] = net
		default:
			kinds = append(kinds, k)
		}
	}
	return kinds, skipped
}
