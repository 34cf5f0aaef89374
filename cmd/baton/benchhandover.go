package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// debugHandover (BATON_HANDOVER_DEBUG=1) makes the members log at DEBUG, with franz-go's
// own log, and the driver print their logs with its clock.
var debugHandover = os.Getenv("BATON_HANDOVER_DEBUG") != ""

// handoverWorkerCommand is the hidden command of one member process of 'baton bench handover'.
const handoverWorkerCommand = "bench-handover-worker"

// benchHandover measures handovers between member processes on a real Kafka and PostgreSQL.
//
// Why processes, not goroutines: a graceful handover starts with a signal (the process's
// shutdown path: Run's ctx ends, the client leaves the group) and a crash is a SIGKILL (no
// leave, no commit: the group learns of it only when the session expires); only a process
// of its own shows both as an operator sees them. The members report their commits on
// stdout (one line per committed batch, with its wall-clock time on the same machine), so the
// driver times from its own signal to the survivor's first commit of each moved partition.
func benchHandover(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench handover", "[flags]", `Measures handovers between two member processes of one group, on a real Kafka and
PostgreSQL (pgfence), while a producer keeps every partition busy:
  graceful  SIGTERM of a member: time from the signal until the other member's first commit
            of every partition the stopped one owned;
  crash     SIGKILL of a member: the same, which waits for the session to expire;
  static    with -static: SIGTERM of a static member (group.instance.id) and its immediate
            restart with the same id: time until the restarted member's first commit, and
            whether its token's epoch (the generation) moved, i.e. whether the group rebalanced.
After each trial the stopped member is replaced and the group left to settle. Prints every
trial and p50/p99 per kind. -profile franz gives the members franz-go's defaults (heartbeat
3s, fetch max wait 5s, metadata min age 5s, rebalance timeout 60s: Baton's defaults before
it set its own);
-profile baton leaves Baton's defaults.
`, stderr)
	var (
		brokers, pg, kinds, profile string
		trials, partitions          int
		session                     time.Duration
	)
	fs.StringVar(&brokers, "brokers", os.Getenv("BATON_KAFKA_BROKERS"), "Kafka seed brokers (default $BATON_KAFKA_BROKERS)")
	fs.StringVar(&pg, "postgres", os.Getenv("BATON_POSTGRES_URL"), "PostgreSQL URL (default $BATON_POSTGRES_URL)")
	fs.StringVar(&kinds, "kinds", "graceful,crash", "trial kinds, comma-separated: graceful, crash, static")
	fs.StringVar(&profile, "profile", "baton", "member client settings: baton (Baton's defaults) or franz (franz-go's)")
	fs.IntVar(&trials, "trials", 20, "trials per kind")
	fs.IntVar(&partitions, "partitions", 4, "topic partitions")
	fs.DurationVar(&session, "session", 10*time.Second, "the members' session timeout")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if brokers == "" || pg == "" {
		return usageError{err: errors.New("-brokers and -postgres are required")}
	}
	if profile != "baton" && profile != "franz" {
		return usageError{err: fmt.Errorf("-profile %q: want baton or franz", profile)}
	}
	for _, k := range strings.Split(kinds, ",") {
		if k != "graceful" && k != "crash" && k != "static" {
			return usageError{err: fmt.Errorf("-kinds: unknown kind %q", k)}
		}
	}
	if trials < 1 || partitions < 2 || session <= 0 {
		return usageError{err: fmt.Errorf("-trials %d, -partitions %d, -session %v: want at least 1, 2 and a positive duration", trials, partitions, session)}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	h := &handover{
		brokers: strings.Split(brokers, ","), pg: pg, self: self, profile: profile, session: session,
		partitions: partitions, out: stdout, log: stderr, procs: map[string]*hoProc{}, events: make(chan hoEvent, 4096),
		owner: map[int32]string{},
	}
	return h.run(ctx, strings.Split(kinds, ","), trials)
}

type handover struct {
	brokers             []string
	pg, self, profile   string
	session             time.Duration
	partitions          int
	topic, group        string
	out, log            io.Writer
	adm                 *kadm.Client
	events              chan hoEvent
	next                int
	procs               map[string]*hoProc // live member processes by name
	owner               map[int32]string   // the member whose commit of the partition came last
	errorLines, regress int                // ERROR log lines of the members; of them, epoch regressions
	mu                  sync.Mutex
}

type hoProc struct {
	name, instance string
	cmd            *exec.Cmd
	exited         chan struct{}
	lastLine       string // the last line of its stderr (under handover.mu): why it exited
}

// hoEvent is one line of a member's stdout: "commit P NANOS" or "claim P ERA EPOCH NANOS".
type hoEvent struct {
	kind, name string
	p          int32
	era, epoch int64
	at         time.Time
}

func (h *handover) run(ctx context.Context, kinds []string, trials int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(h.brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	if err != nil {
		return err
	}
	defer cl.Close()
	h.adm = kadm.NewClient(cl)
	stamp := strconv.FormatInt(time.Now().UnixNano(), 36)
	h.topic, h.group = "handover-"+stamp, "handover-"+stamp
	if _, err := h.adm.CreateTopic(ctx, int32(h.partitions), 1, nil, h.topic); err != nil {
		return fmt.Errorf("create topic: %w", err)
	}
	defer func() { _, _ = h.adm.DeleteTopics(context.Background(), h.topic) }()
	pctx, stopProducing := context.WithCancel(ctx)
	defer stopProducing()
	go h.produce(pctx, cl)
	defer h.stopAll()

	fmt.Fprintf(h.out, "handover bench: topic %s, %d partitions, 2 members, profile %s, session timeout %v\n", h.topic, h.partitions, h.profile, h.session)
	results := map[string][]time.Duration{}
	for _, kind := range kinds {
		static := kind == "static"
		h.stopAll()
		for range 2 {
			if err := h.start(static, ""); err != nil {
				return err
			}
		}
		if err := h.settle(ctx); err != nil {
			return err
		}
		for i := 0; i < trials; i++ {
			d, note, err := h.trial(ctx, kind)
			if err != nil {
				return fmt.Errorf("%s trial %d: %w", kind, i+1, err)
			}
			results[kind] = append(results[kind], d)
			fmt.Fprintf(h.log, "%s trial %d: %v %s\n", kind, i+1, d.Round(time.Millisecond), note)
			if err := h.settle(ctx); err != nil {
				return err
			}
		}
	}
	h.stopAll()
	fmt.Fprintf(h.out, "\n| kind | trials | p50 | p99 | max |\n|---|---|---|---|---|\n")
	for _, kind := range kinds {
		ds := results[kind]
		slices.Sort(ds)
		fmt.Fprintf(h.out, "| %s | %d | %v | %v | %v |\n", kind, len(ds), quantile(ds, 0.5), quantile(ds, 0.99), ds[len(ds)-1].Round(time.Millisecond))
	}
	h.mu.Lock()
	fmt.Fprintf(h.out, "\nmember log lines at ERROR: %d (epoch regressions among them: %d)\n", h.errorLines, h.regress)
	h.mu.Unlock()
	return nil
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, i)].Round(time.Millisecond)
}

// produce keeps every partition busy: a record per partition every 10ms, a rate the members
// keep up with on a loaded machine (a member behind its partitions stops polling under
// backpressure, and a partition handed to it waits for its backlog: that is measured by the
// throughput benchmark, not here).
func (h *handover) produce(ctx context.Context, cl *kgo.Client) {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for p := 0; p < h.partitions; p++ {
			cl.Produce(ctx, &kgo.Record{Topic: h.topic, Partition: int32(p), Value: []byte(strconv.Itoa(n))}, nil)
		}
	}
}

// start starts a member process; instance is its group.instance.id when static (a new one
// if empty).
func (h *handover) start(static bool, instance string) error {
	h.next++
	name := "m" + strconv.Itoa(h.next)
	if static && instance == "" {
		instance = "static-" + name
	}
	args := []string{handoverWorkerCommand, "-brokers", strings.Join(h.brokers, ","), "-postgres", h.pg, "-topic", h.topic,
		"-group", h.group, "-name", name, "-profile", h.profile, "-session", h.session.String(), "-instance", instance}
	cmd := exec.Command(h.self, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	errs, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	p := &hoProc{name: name, instance: instance, cmd: cmd, exited: make(chan struct{})}
	h.procs[name] = p
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if ev, ok := parseHoEvent(name, sc.Text()); ok {
				h.events <- ev
			}
		}
	}()
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(errs)
		for sc.Scan() {
			line := sc.Text()
			h.mu.Lock()
			p.lastLine = line
			h.mu.Unlock()
			if debugHandover {
				fmt.Fprintf(h.log, "  %s %s: %s\n", time.Now().Format("15:04:05.000"), name, line)
			}
			if strings.Contains(line, "level=ERROR") {
				h.mu.Lock()
				h.errorLines++
				if strings.Contains(line, "regression") {
					h.regress++
				}
				h.mu.Unlock()
				fmt.Fprintf(h.log, "  %s: %s\n", name, line)
			}
		}
	}()
	go func() { wg.Wait(); _ = cmd.Wait(); close(p.exited) }()
	return nil
}

func parseHoEvent(name, line string) (hoEvent, bool) {
	f := strings.Fields(line)
	num := func(i int) int64 {
		if i >= len(f) {
			return -1
		}
		n, _ := strconv.ParseInt(f[i], 10, 64)
		return n
	}
	switch {
	case len(f) == 3 && f[0] == "commit":
		return hoEvent{kind: "commit", name: name, p: int32(num(1)), at: time.Unix(0, num(2))}, true
	case len(f) == 5 && f[0] == "claim":
		return hoEvent{kind: "claim", name: name, p: int32(num(1)), era: num(2), epoch: num(3), at: time.Unix(0, num(4))}, true
	}
	return hoEvent{}, false
}

func (h *handover) stopAll() {
	for name, p := range h.procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		delete(h.procs, name)
	}
}

// settle waits until the group is stable with the live members, each owning a partition, and
// every partition has been committed by its owner since: the next trial starts from a group
// at rest. Bounded.
func (h *handover) settle(ctx context.Context) error {
	deadline := time.Now().Add(2*h.session + time.Minute)
	since := time.Now()
	fresh := map[int32]bool{}
	for time.Now().Before(deadline) && ctx.Err() == nil {
		for name, p := range h.procs {
			select {
			case <-p.exited: // a member that stopped will not settle: say why now, not at the deadline
				h.mu.Lock()
				last := p.lastLine
				h.mu.Unlock()
				return fmt.Errorf("member %s exited (%v) while the group was settling: %s", name, p.cmd.ProcessState, last)
			default:
			}
		}
		h.drain(func(ev hoEvent) {
			if ev.kind == "commit" && !ev.at.Before(since) {
				fresh[ev.p] = true
			}
		})
		owners := map[string]bool{}
		for _, o := range h.owner {
			owners[o] = true
		}
		if len(fresh) == h.partitions && len(owners) == len(h.procs) {
			gs, err := h.adm.DescribeGroups(ctx, h.group)
			if err == nil && gs[h.group].State == "Stable" && len(gs[h.group].Members) == len(h.procs) {
				time.Sleep(500 * time.Millisecond) // past the group's own settling (a second cooperative round)
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("the group did not settle within %v (owners %v)", 2*h.session+time.Minute, h.owner)
}

// drain applies every pending event to the ownership map and passes it to f.
func (h *handover) drain(f func(hoEvent)) {
	for {
		select {
		case ev := <-h.events:
			if ev.kind == "commit" {
				if _, live := h.procs[ev.name]; live {
					h.owner[ev.p] = ev.name
				}
			}
			f(ev)
		default:
			return
		}
	}
}

// trial stops the owner of partition 0 and measures until the moved partitions are committed
// by their next owner.
func (h *handover) trial(ctx context.Context, kind string) (time.Duration, string, error) {
	h.drain(func(hoEvent) {})
	victim := h.procs[h.owner[0]]
	if victim == nil {
		return 0, "", fmt.Errorf("partition 0 has no live owner (%v)", h.owner)
	}
	moved := map[int32]bool{}
	epochs := map[int32]string{}
	for p, o := range h.owner {
		if o == victim.name {
			moved[p] = true
		}
	}
	sig := syscall.SIGTERM
	if kind == "crash" {
		sig = syscall.SIGKILL
	}
	t0 := time.Now()
	if err := victim.cmd.Process.Signal(sig); err != nil {
		return 0, "", err
	}
	if debugHandover {
		fmt.Fprintf(h.log, "  %s driver: %v sent to %s\n", t0.Format("15:04:05.000"), sig, victim.name)
	}
	delete(h.procs, victim.name)
	if kind == "static" {
		if err := h.start(true, victim.instance); err != nil {
			return 0, "", err
		}
	}
	done := map[int32]time.Time{}
	bound := time.After(h.session + time.Minute)
	for len(done) < len(moved) {
		select {
		case <-ctx.Done():
			return 0, "", ctx.Err()
		case <-bound:
			return 0, "", fmt.Errorf("partitions %v not committed by a new owner within %v", moved, h.session+time.Minute)
		case ev := <-h.events:
			if _, live := h.procs[ev.name]; !live {
				continue
			}
			switch {
			case ev.kind == "claim" && moved[ev.p]:
				epochs[ev.p] = fmt.Sprintf("p%d era %d epoch %d", ev.p, ev.era, ev.epoch)
			case ev.kind == "commit":
				h.owner[ev.p] = ev.name
				if moved[ev.p] && ev.at.After(t0) && done[ev.p].IsZero() {
					done[ev.p] = ev.at
				}
			}
		}
	}
	var last time.Time
	for _, t := range done {
		if t.After(last) {
			last = t
		}
	}
	if debugHandover {
		fmt.Fprintf(h.log, "  %s driver: last moved partition committed\n", last.Format("15:04:05.000"))
	}
	<-victim.exited
	note := fmt.Sprintf("(%d partitions moved", len(moved))
	if len(epochs) > 0 {
		ks := slices.Sorted(func(yield func(string) bool) {
			for _, v := range epochs {
				if !yield(v) {
					return
				}
			}
		})
		note += "; new claims: " + strings.Join(ks, ", ")
	}
	note += ")"
	if kind != "static" {
		if err := h.start(false, ""); err != nil {
			return 0, "", err
		}
	}
	return last.Sub(t0), note, nil
}

// handoverWorker is one member: a consumer over pgfence whose handler does nothing (each
// batch's transaction advances the fence's position), printing a line per claim and commit.
func handoverWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(handoverWorkerCommand, "[flags]", "One member process of 'baton bench handover'.", stderr)
	var brokers, pg, topic, group, name, profile, instance string
	var session time.Duration
	fs.StringVar(&brokers, "brokers", "", "")
	fs.StringVar(&pg, "postgres", "", "")
	fs.StringVar(&topic, "topic", "", "")
	fs.StringVar(&group, "group", "", "")
	fs.StringVar(&name, "name", "", "")
	fs.StringVar(&profile, "profile", "baton", "")
	fs.StringVar(&instance, "instance", "", "")
	fs.DurationVar(&session, "session", 10*time.Second, "")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, pg)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := pgfence.New(pool)
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	w := &lockedWriter{w: stdout}
	kopts := []kgo.Opt{kgo.SeedBrokers(strings.Split(brokers, ",")...), kgo.SessionTimeout(session),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}
	if profile == "franz" {
		kopts = append(kopts, kgo.HeartbeatInterval(3*time.Second), kgo.FetchMaxWait(5*time.Second),
			kgo.MetadataMinAge(5*time.Second), kgo.RebalanceTimeout(time.Minute))
	}
	if instance != "" {
		kopts = append(kopts, kgo.InstanceID(instance))
	}
	factory := func(_ context.Context, k fence.Key, t fence.Token) (consumer.Handler[pgx.Tx], error) {
		fmt.Fprintf(w, "claim %d %d %d %d\n", k.Partition, t.Era, t.Epoch, time.Now().UnixNano())
		return consumer.Handler[pgx.Tx](func(context.Context, pgx.Tx, *consumer.Batch) error { return nil }), nil
	}
	level := slog.LevelWarn
	if debugHandover {
		level = slog.LevelDebug
		kopts = append(kopts, kgo.WithLogger(kgo.BasicLogger(stderr, kgo.LogLevelInfo, nil)))
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})).With("member", name)
	c, err := consumer.New(group, []string{topic}, &reportingSink{Sink: store, w: w}, nil, consumer.PerPartition(factory),
		consumer.Kafka(kopts...), consumer.Logger(log))
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

// reportingSink prints "commit P NANOS" after every committed Apply.
type reportingSink struct {
	fence.Sink[pgx.Tx]
	w io.Writer
}

func (s *reportingSink) Apply(ctx context.Context, k fence.Key, t fence.Token, first, position int64, fn func(context.Context, pgx.Tx) error) error {
	if err := s.Sink.Apply(ctx, k, t, first, position, fn); err != nil {
		return err
	}
	fmt.Fprintf(s.w, "commit %d %d\n", k.Partition, time.Now().UnixNano())
	return nil
}
