package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf16"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The faults aimed at the group coordinator's and static membership's interleavings. Each proves it happened before its outcome
// counts (Fault.Bit) and writes its evidence in Fault.Detail: the coordinator's loads as the
// broker logged them, the coordinator's node before and after, the replaced static member's
// member ids, the receiver's out-of-order reads.

// held is a write a frozen worker holds: the partition and the token of its batch.
type held struct {
	p           *proc
	topic       string
	part        int32
	era, epoch  int64
	since, from int64 // when the freeze was asked (ms), and the applied log's id then
}

// holdWrite asks p to freeze at its next write (sig, logging marker) and waits until it is
// stopped holding it.
func (h *harness) holdWrite(ctx context.Context, p *proc, sig syscall.Signal, marker string) (held, error) {
	w := held{p: p, since: time.Now().UnixMilli()}
	_ = h.db.QueryRow(ctx, `SELECT COALESCE(max(id), 0) FROM chaos_applied`).Scan(&w.from)
	_ = p.cmd.Process.Signal(sig)
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := h.db.QueryRow(ctx, `SELECT topic, part, era, epoch FROM chaos_attempts WHERE worker = $1 AND outcome = $3 AND at_ms >= $2 ORDER BY id DESC LIMIT 1`,
			p.id, w.since, marker).Scan(&w.topic, &w.part, &w.era, &w.epoch)
		if err == nil && stopped(p.cmd.Process.Pid) {
			return w, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
			return w, errors.New("worker did not reach a write (no partitions?)")
		}
		sleep(ctx, 50*time.Millisecond)
	}
}

func (w held) String() string {
	return fmt.Sprintf("%s holding %s/%d at token %d.%d", w.p.id, w.topic, w.part, w.era, w.epoch)
}

// committedBy waits until another worker commits a batch of w's partition whose token
// satisfies cond (SQL over era and epoch, with $3 the held era and $4 the held epoch), and
// returns that worker and token.
func (h *harness) committedBy(ctx context.Context, w held, cond string, wait time.Duration) (worker string, era, epoch int64, ok bool) {
	deadline := time.Now().Add(wait)
	for {
		err := h.db.QueryRow(ctx, `SELECT worker, era, epoch FROM chaos_applied WHERE topic = $5 AND part = $1 AND worker <> $2 AND id > $6 AND (`+cond+`) ORDER BY id LIMIT 1`,
			w.part, w.p.id, w.era, w.epoch, w.topic, w.from).Scan(&worker, &era, &epoch)
		if err == nil {
			return worker, era, epoch, true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return "", 0, 0, false
		}
		sleep(ctx, 100*time.Millisecond)
	}
}

// pausedCoordinatorMove is FaultPausedBrokerRestart and FaultCoordinatorKill: a writer Z frozen
// at its next write is taken over; then the group coordinator's broker is restarted (killed,
// for FaultCoordinatorKill) and Z resumed as soon as a coordinator starts loading the group, so
// that Z, whose held write and claim the fence refuses as stale, asks the coordinator for its
// currentness proof while the coordinator is still loading (a loading coordinator answers a
// Heartbeat blindly). The fault counts only when that interleaving is
// seen, in up to maxMoveAttempts attempts (each freezes a writer and moves the coordinator
// again): the load in the broker's own log; the coordinator answering the harness's direct
// probes COORDINATOR_LOAD_IN_PROGRESS; and, in Z's log, a claim of the held partition refused
// as stale and Z asking the coordinator for its proof, after it resumed and before the
// coordinator's last loading answer (countAsks). Z's
// blind confirmations (a regression "confirmed" while the coordinator was loading, which only
// a build with the blind Heartbeat proof logs) are counted in the detail.
func (h *harness) pausedCoordinatorMove(ctx context.Context, f *Fault) {
	h.primeLoad(ctx)
	var targets, ev []string
	for attempt := 1; attempt <= maxMoveAttempts && ctx.Err() == nil; attempt++ {
		a := h.moveOnce(ctx, f.Kind)
		if a.target != "" {
			targets = append(targets, a.target)
		}
		ev = append(ev, fmt.Sprintf("attempt %d/%d: %s", attempt, maxMoveAttempts, a.detail))
		h.progress("fault %s attempt %d/%d: interleaving seen %v", f.Kind, attempt, maxMoveAttempts, a.proven)
		if a.proven {
			f.Bit = true
			break
		}
		if a.stop {
			break
		}
	}
	f.Target = strings.Join(targets, ",")
	f.Detail = strings.Join(ev, " | ")
	f.End = time.Now()
	sleep(ctx, h.cfg.SessionTimeout)
}

// maxMoveAttempts bounds the attempts of a coordinator-loading fault at its interleaving.
const maxMoveAttempts = 3

// moveAttempt is one attempt of pausedCoordinatorMove.
type moveAttempt struct {
	target string
	detail string
	proven bool // the interleaving was seen
	stop   bool // no point in another attempt (no worker alive, no coordinator)
}

func (h *harness) moveOnce(ctx context.Context, kind FaultKind) (a moveAttempt) {
	st := h.cfg.SessionTimeout
	var p *proc
	var w held
	err := errors.New("no worker alive")
	for try := 0; try < 3 && err != nil; try++ { // a writer that lost its partitions meanwhile: another
		if p = h.pickWriter(ctx); p == nil {
			break
		}
		w, err = h.holdWrite(ctx, p, syscall.SIGUSR1, OutcomeFrozen)
	}
	if err != nil {
		a.detail, a.stop = err.Error(), p == nil
		return a
	}
	a.target = p.id
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	defer resume()
	by, era, epoch, ok := h.committedBy(ctx, w, `era > $3 OR (era = $3 AND epoch > $4)`, 3*st+30*time.Second)
	if !ok {
		a.detail = w.String() + "; no takeover seen"
		return a
	}
	ev := []string{fmt.Sprintf("%s, taken over by %s at %d.%d", w, by, era, epoch)}
	defer func() { a.detail = strings.Join(ev, "; ") }()

	before, _ := h.coordinator(ctx)
	logs := h.brokerLogs(ctx)
	var action []string
	switch {
	case h.cfg.KafkaNodes > 1 && before < 0:
		ev = append(ev, "no group coordinator found")
		a.stop = true
		return a
	case h.cfg.KafkaNodes > 1 && kind == FaultCoordinatorKill:
		action = []string{"node-kill", strconv.Itoa(int(before))}
	case h.cfg.KafkaNodes > 1:
		action = []string{"node-restart", strconv.Itoa(int(before))}
	default:
		action = []string{"restart"}
	}
	ev = append(ev, fmt.Sprintf("coordinator node %d: kafka.sh %s", before, strings.Join(action, " ")))

	// The broker action runs while the logs are watched for the coordinator's load.
	actionStart := time.Now()
	var scriptOK atomic.Bool
	var scriptOut string
	done := make(chan struct{})
	go func() {
		defer close(done)
		ok, out := h.script(ctx, "kafka.sh", action...)
		scriptOut = out
		scriptOK.Store(ok)
	}()
	// Ask every broker directly for the group meanwhile, noting its COORDINATOR_LOAD_IN_PROGRESS answers.
	probeCtx, stopProbe := context.WithCancel(ctx)
	var loading loadAnswers
	var probes sync.WaitGroup
	probes.Add(1)
	go func() { defer probes.Done(); h.probeLoading(probeCtx, &loading) }()

	var sched, fin *loadLine
	var resumedAt time.Time
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		for _, l := range logs {
			for _, ll := range l.scan() {
				if !ll.at.Before(actionStart.Add(-time.Second)) {
					if ll.finished && fin == nil && sched != nil {
						fin = ll
					} else if !ll.finished && sched == nil {
						sched = ll
					}
				}
			}
		}
		if sched != nil && !resumed {
			resume()
			resumedAt = time.Now()
		}
		if fin != nil {
			break
		}
		sleep(ctx, 20*time.Millisecond)
	}
	<-done
	// Let the resumed worker meet the coordinator, then stop probing.
	sleep(ctx, st)
	stopProbe()
	probes.Wait()
	if !scriptOK.Load() {
		ev = append(ev, "broker action failed: "+scriptOut)
	}
	after, _ := h.coordinator(ctx)
	ev = append(ev, fmt.Sprintf("coordinator node after: %d", after))
	switch {
	case sched == nil:
		ev = append(ev, "no coordinator load seen in the broker logs")
	default:
		ev = append(ev, fmt.Sprintf("node log %s: %s", sched.log, sched.text))
		if fin != nil {
			ev = append(ev, fmt.Sprintf("%s: %s", fin.log, fin.text))
		}
		if !resumedAt.IsZero() {
			ev = append(ev, fmt.Sprintf("%s resumed at %s", p.id, resumedAt.Format(stamp)))
		}
	}
	n, first, last := loading.get()
	if n > 0 {
		ev = append(ev, fmt.Sprintf("COORDINATOR_LOAD_IN_PROGRESS answered to the harness %d times, %s..%s", n, first.Format(stamp), last.Format(stamp)))
	} else {
		ev = append(ev, "COORDINATOR_LOAD_IN_PROGRESS never answered to the harness")
	}
	// Z's own account: its questions to the coordinator about the held partition after it
	// resumed, while the coordinator still answered loading. The question that counts is a
	// claim's: the held write's is usually cut short by Z's watchdog (its session expired while
	// it was frozen), while a claim comes from a worker the watchdog restarted once franz-go's
	// heartbeat was answered (a loading coordinator answers it blindly too), and that worker
	// asks to the end. The regressions "confirmed" meanwhile are the blind answers.
	var asked, wrote, blind int
	var askedAt time.Time
	if !resumedAt.IsZero() && n > 0 {
		asked, wrote, blind, askedAt = countAsks(h.workerLog(p.id, w.topic, w.part, resumedAt), last)
	}
	switch {
	case asked > 0:
		ev = append(ev, fmt.Sprintf("%s, its claim on %s/%d refused, asked the loading coordinator %d times whether it owns it (first at %s; %d questions after a refused write); %d regressions confirmed by the loading coordinator",
			p.id, w.topic, w.part, asked, askedAt.Format(stamp), wrote, blind))
	case n > 0:
		ev = append(ev, fmt.Sprintf("%s made no claim on %s/%d that asked the coordinator while it was loading (%d questions after a refused write)", p.id, w.topic, w.part, wrote))
	}
	a.proven = scriptOK.Load() && sched != nil && fin != nil && resumed && (asked > 0 || !h.cfg.ProveAsk)
	if kind == FaultCoordinatorKill {
		a.proven = a.proven && after >= 0 && after != before
		// Restart the killed broker: the cluster is whole again for the next fault.
		ok, out := h.script(ctx, "kafka.sh", "node-start", strconv.Itoa(int(before)))
		ev = append(ev, fmt.Sprintf("node %d restarted: %v %s", before, ok, out))
	}
	return a
}

// The times in a fault's evidence.
const stamp = "15:04:05.000"

// What the consumer logs when it asks the coordinator for its currentness proof after a
// refusal (a claim's, or a write's), and when the coordinator confirms a member whose token the
// sink refused (a regression).
const (
	askMsg      = "asking the coordinator whether this member"
	claimPrefix = "claim refused as stale"
	blindMsg    = "the coordinator confirms this member owns the partition"
)

// loadAnswers notes the COORDINATOR_LOAD_IN_PROGRESS answers a probe saw.
type loadAnswers struct {
	mu          sync.Mutex
	n           int
	first, last time.Time
}

func (l *loadAnswers) add(at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n++; l.first.IsZero() {
		l.first = at
	}
	l.last = at
}

func (l *loadAnswers) get() (int, time.Time, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n, l.first, l.last
}

// countAsks counts, in a worker's lines up to last, the questions to the coordinator after a
// refused claim (asked, the first at askedAt) and after a refused write (wrote), and the
// regressions the coordinator confirmed (blind).
func countAsks(lines []workerLine, last time.Time) (asked, wrote, blind int, askedAt time.Time) {
	for _, l := range lines {
		if l.at.After(last) {
			continue
		}
		switch {
		case strings.Contains(l.msg, askMsg) && strings.HasPrefix(l.msg, claimPrefix):
			if asked++; askedAt.IsZero() {
				askedAt = l.at
			}
		case strings.Contains(l.msg, askMsg):
			wrote++
		case strings.Contains(l.msg, blindMsg):
			blind++
		}
	}
	return asked, wrote, blind, askedAt
}

// workerLine is one line of a worker's log about one partition.
type workerLine struct {
	at  time.Time
	msg string
}

var (
	workerLineRE = regexp.MustCompile(`^time=(\S+) level=\S+ msg="((?:[^"\\]|\\.)*)"`)
	workerPartRE = regexp.MustCompile(` topic=(\S+) partition=(\d+)( |$)`)
)

// workerLog returns worker id's log lines about topic/part from since on (its stderr files in
// the run's LogDir).
func (h *harness) workerLog(id, topic string, part int32, since time.Time) []workerLine {
	dir := h.cfg.LogDir
	if dir == "" {
		dir = os.TempDir()
	}
	files, _ := filepath.Glob(filepath.Join(dir, "baton-chaos-"+id+"-*.log"))
	var out []workerLine
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			m := workerLineRE.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			pm := workerPartRE.FindStringSubmatch(line[len(m[0]):])
			if pm == nil || strings.Trim(pm[1], `"`) != topic || pm[2] != strconv.Itoa(int(part)) {
				continue
			}
			at, err := time.Parse(time.RFC3339Nano, m[1])
			if err != nil || at.Before(since) {
				continue
			}
			out = append(out, workerLine{at: at, msg: m[2]})
		}
	}
	return out
}

// coordinator returns the node id of the run's group coordinator (-1 if it cannot be found).
func (h *harness) coordinator(ctx context.Context) (int32, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resps := h.adm.FindGroupCoordinators(ctx, h.cfg.Group)
	r, ok := resps[h.cfg.Group]
	if !ok || r.Err != nil {
		return -1, fmt.Errorf("find coordinator: %v", r.Err)
	}
	return r.NodeID, nil
}

// probeLoading asks every broker directly (no coordinator lookup, no retry) for the group's
// description every 50 ms and notes when one answers COORDINATOR_LOAD_IN_PROGRESS: the
// coordinator itself saying that it is loading the group.
func (h *harness) probeLoading(ctx context.Context, seen *loadAnswers) {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(h.cfg.Brokers...), kgo.RequestRetries(0),
		kgo.RetryTimeout(time.Second), kgo.DialTimeout(time.Second)}, h.cfg.Kafka...)...)
	if err != nil {
		return
	}
	defer cl.Close()
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		if len(cl.DiscoveredBrokers()) == 0 {
			_, _ = kmsg.NewPtrMetadataRequest().RequestWith(rctx, cl)
		}
		for _, b := range cl.DiscoveredBrokers() {
			req := kmsg.NewPtrDescribeGroupsRequest()
			req.Groups = []string{h.cfg.Group}
			resp, err := b.Request(rctx, req)
			if err != nil {
				continue
			}
			for _, g := range resp.(*kmsg.DescribeGroupsResponse).Groups {
				if errors.Is(kerr.ErrorForCode(g.ErrorCode), kerr.CoordinatorLoadInProgress) {
					seen.add(time.Now())
				}
			}
		}
		cancel()
		sleep(ctx, 50*time.Millisecond)
	}
}

// primeLoad fills the group coordinator's log once per run with Config.LoadFiller offset
// commits of a filler group, so that loading the run's group after a broker move takes long
// enough for a resumed worker's requests to meet it: written straight to the group's
// __consumer_offsets partition (fillDirect, fast), or, where the broker refuses that, through
// the OffsetCommit API (100 a request).
func (h *harness) primeLoad(ctx context.Context) {
	h.primeMu.Lock()
	defer h.primeMu.Unlock()
	if h.primed || h.cfg.LoadFiller < 0 {
		return
	}
	h.primed = true
	t0 := time.Now()
	if err := h.fillDirect(ctx, h.cfg.LoadFiller); err == nil {
		h.progress("filled the coordinator's log with %d offset commit records of %s-filler in %.1fs", h.cfg.LoadFiller, h.cfg.Group, time.Since(t0).Seconds())
		return
	} else {
		h.progress("filling the coordinator's log directly: %v; committing through the API instead", err)
	}
	group := h.cfg.Group + "-filler"
	// Offsets of a filler topic of 100 partitions (never produced to), 100 records a request:
	// the coordinator loads every one.
	topic := h.cfg.Topic + "-filler"
	const parts = 100
	if resp, err := h.adm.CreateTopic(ctx, parts, 1, nil, topic); err != nil || resp.Err != nil {
		h.progress("filling the coordinator's log: create %s: %v", topic, errors.Join(err, resp.Err))
		return
	}
	rounds := (h.cfg.LoadFiller + parts - 1) / parts
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(rounds) || ctx.Err() != nil {
					return
				}
				offs := kadm.Offsets{}
				for p := 0; p < parts; p++ {
					offs.Add(kadm.Offset{Topic: topic, Partition: int32(p), At: i, LeaderEpoch: -1, Metadata: "chaos load filler"})
				}
				for try := 0; ; try++ { // the new topic's metadata may not have reached every broker yet
					resp, err := h.adm.CommitOffsets(ctx, group, offs)
					if err == nil {
						err = resp.Error()
					}
					if err == nil || ctx.Err() != nil {
						break
					}
					if try == 50 {
						h.progress("filling the coordinator's log: %v", err)
						return
					}
					sleep(ctx, 200*time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	h.progress("filled the coordinator's log with %d offset commits of %s", rounds*parts, group)
}

// fillDirect appends n offset commit records of a filler group (100 keys, overwritten in turn:
// the coordinator's memory does not grow) to the run's group's __consumer_offsets partition,
// as the coordinator itself would write them (record key version 1, value version 3),
// zstd-compressed batches of 10000 (repetitive, so the log grows little: no segment rolls,
// nothing for the log cleaner to compact away). Kafka lets a producer whose client id is
// "__admin_client" write internal topics. The coordinator replays every record when it loads
// the partition, so loading takes time in proportion to n.
func (h *harness) fillDirect(ctx context.Context, n int) error {
	const offsetsTopic = "__consumer_offsets"
	md, err := h.adm.Metadata(ctx, offsetsTopic)
	if err != nil {
		return err
	}
	td, ok := md.Topics[offsetsTopic]
	if !ok || td.Err != nil || len(td.Partitions) == 0 {
		return fmt.Errorf("no %s topic (%v)", offsetsTopic, td.Err)
	}
	part := groupPartition(h.cfg.Group, len(td.Partitions))
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(h.cfg.Brokers...), kgo.ClientID("__admin_client"),
		kgo.DefaultProduceTopic(offsetsTopic), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchCompression(kgo.ZstdCompression()), kgo.ProducerBatchMaxBytes(4 << 20),
		kgo.MaxBufferedRecords(50000), kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(20 * time.Millisecond)}, h.cfg.Kafka...)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	group, topic := h.cfg.Group+"-filler", h.cfg.Topic+"-filler"
	now := time.Now().UnixMilli()
	var failed atomic.Pointer[error]
	for i := 0; i < n && failed.Load() == nil && ctx.Err() == nil; i++ {
		k := kmsg.OffsetCommitKey{Version: 1, Group: group, Topic: topic, Partition: int32(i % 100)}
		v := kmsg.OffsetCommitValue{Version: 3, Offset: int64(i / 100), LeaderEpoch: -1, Metadata: "chaos load filler", CommitTimestamp: now}
		r := &kgo.Record{Partition: part, Key: k.AppendTo(nil), Value: v.AppendTo(nil)}
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				failed.CompareAndSwap(nil, &err)
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return err
	}
	if e := failed.Load(); e != nil {
		return *e
	}
	return ctx.Err()
}

// groupPartition is the __consumer_offsets partition of group: Kafka's
// Utils.abs(group.hashCode()) % partitions, with Java's String.hashCode.
func groupPartition(group string, partitions int) int32 {
	var h int32
	for _, c := range utf16.Encode([]rune(group)) {
		h = 31*h + int32(c)
	}
	if h == math.MinInt32 {
		h = 0
	} else if h < 0 {
		h = -h
	}
	return h % int32(partitions)
}

// brokerLog is one broker's log file, read from where it was when the fault began.
type brokerLog struct {
	path string
	off  int64
	rest string // a partial last line
}

type loadLine struct {
	log      string
	at       time.Time
	finished bool
	text     string
}

// brokerLogs returns the run's broker logs (kafka.sh logfile), positioned at their ends.
func (h *harness) brokerLogs(ctx context.Context) []*brokerLog {
	cmdOut, err := h.scriptOutput(ctx, "kafka.sh", "logfile")
	if err != nil {
		return nil
	}
	var out []*brokerLog
	for _, p := range strings.Fields(cmdOut) {
		l := &brokerLog{path: p}
		if fi, err := os.Stat(p); err == nil {
			l.off = fi.Size()
		}
		out = append(out, l)
	}
	return out
}

// The group coordinator's load of an offsets partition, as Kafka 4.x's CoordinatorRuntime logs it.
var loadRE = regexp.MustCompile(`^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] INFO \[GroupCoordinator id=(\d+)\] (Scheduling loading|Finished loading) of metadata from (__consumer_offsets-\d+)(.*?)\(org`)

// scan returns the coordinator load lines appended since the last scan.
func (l *brokerLog) scan() []*loadLine {
	f, err := os.Open(l.path)
	if err != nil {
		return nil
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil
	}
	if fi.Size() < l.off {
		l.off, l.rest = 0, "" // rotated or truncated
	}
	if _, err := f.Seek(l.off, io.SeekStart); err != nil {
		return nil
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil
	}
	l.off += int64(len(b))
	text := l.rest + string(b)
	i := strings.LastIndexByte(text, '\n')
	if i < 0 {
		l.rest = text
		return nil
	}
	l.rest = text[i+1:]
	var out []*loadLine
	sc := bufio.NewScanner(strings.NewReader(text[:i]))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m := loadRE.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		at, err := time.ParseInLocation("2006-01-02 15:04:05,000", m[1], time.Local)
		if err != nil {
			continue
		}
		out = append(out, &loadLine{log: "node " + m[2], at: at, finished: m[3] == "Finished loading",
			text: strings.TrimSpace(m[3] + " of " + m[4] + m[5])})
	}
	return out
}

// staticReplace is FaultStaticReplace: a static member frozen at its next write is replaced
// by a new process with the same group.instance.id, which the coordinator gives the same
// assignment at the same generation (no rebalance); once the replacement has written to the
// frozen worker's partition, the frozen one is resumed (its held write and the next ones are
// a zombie's), then stopped. Proven by the group's member ids (the instance's changed, no
// other member's did) and by the replacement's commit on that partition; the detail says
// whether it carried the held generation (the equal-token race: when the partition was
// assigned at the group's current generation). Up to maxMoveAttempts attempts, each replacing
// a writer (replaceOnce).
func (h *harness) staticReplace(ctx context.Context, f *Fault) {
	var targets, ev []string
	for attempt := 1; attempt <= maxMoveAttempts && ctx.Err() == nil; attempt++ {
		a := h.replaceOnce(ctx)
		if a.target != "" {
			targets = append(targets, a.target)
		}
		ev = append(ev, fmt.Sprintf("attempt %d/%d: %s", attempt, maxMoveAttempts, a.detail))
		if a.proven || a.stop {
			f.Bit = a.proven
			break
		}
		sleep(ctx, 2*h.cfg.SessionTimeout) // the group settles after the interfering rebalance
	}
	f.Target = strings.Join(targets, ",")
	f.Detail = strings.Join(ev, " | ")
	f.End = time.Now()
	sleep(ctx, h.cfg.SessionTimeout)
}

// replaceOnce is one attempt of staticReplace: proven when the replacement committed on the
// held partition while no other member's id changed. A rebalance meanwhile (another member
// rejoining under load, a session expiring) can move the held partition elsewhere and changes
// the others' ids: the attempt then proves nothing, and another is made.
func (h *harness) replaceOnce(ctx context.Context) (a moveAttempt) {
	st := h.cfg.SessionTimeout
	p := h.pickWriter(ctx)
	if p == nil || p.instance == "" {
		a.detail, a.stop = "no static worker alive", true
		return a
	}
	a.target = p.id
	membersBefore := h.members(ctx)
	w, err := h.holdWrite(ctx, p, syscall.SIGUSR1, OutcomeFrozen)
	if err != nil {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		a.detail = err.Error()
		return a
	}
	defer func() { _ = p.cmd.Process.Signal(syscall.SIGCONT) }()
	r, err := h.startAs(ctx, p.instance)
	if err != nil {
		a.detail, a.stop = err.Error(), true
		return a
	}
	ev := []string{w.String(), fmt.Sprintf("replaced by %s as instance %s", r.id, p.instance)}
	// The replacement's first commit on the held partition: at the held generation if the group
	// has not moved on since that partition was assigned (the equal-token race), else later.
	var sameGen, took bool
	deadline := time.Now().Add(3*st + 30*time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		var era, epoch int64
		err := h.db.QueryRow(ctx, `SELECT era, epoch FROM chaos_applied WHERE topic = $1 AND part = $2 AND worker = $3 ORDER BY id LIMIT 1`,
			w.topic, w.part, r.id).Scan(&era, &epoch)
		if err == nil {
			took, sameGen = true, epoch == w.epoch
			ev = append(ev, fmt.Sprintf("%s committed on %s/%d at %d.%d", r.id, w.topic, w.part, era, epoch))
			break
		}
		sleep(ctx, 100*time.Millisecond)
	}
	// The replacement joins each of the run's groups on its own: it may have committed in one
	// before it replaced its predecessor in another. Wait (a few session timeouts) until it has
	// in every group the predecessor was in.
	var changed, others int
	var ids []string
	want := instancesIn(membersBefore, p.instance)
	for end := time.Now().Add(3 * st); ; {
		membersAfter := h.members(ctx)
		changed, others, ids = 0, 0, ids[:0]
		for key, m := range membersBefore {
			if now, ok := membersAfter[key]; ok && now != m {
				if key.instance == p.instance {
					changed++
					ids = append(ids, fmt.Sprintf("member id of %s in %s: %s -> %s", key.instance, key.group, clip(m, 40), clip(now, 40)))
				} else {
					others++
				}
			}
		}
		if !took || changed == want || !time.Now().Before(end) || ctx.Err() != nil {
			break
		}
		sleep(ctx, 250*time.Millisecond)
	}
	ev = append(ev, ids...)
	if others > 0 {
		ev = append(ev, fmt.Sprintf("%d other members changed ids (a rebalance)", others))
	}
	// Resume the frozen one: its held write meets the replacement's fence.
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	sleep(ctx, st)
	h.stop(p, syscall.SIGTERM, 30*time.Second)
	a.proven = took && changed > 0 && changed == want && others == 0
	switch {
	case !took:
		ev = append(ev, "no commit of the replacement on the held partition seen")
	case sameGen:
		ev = append(ev, "the replacement's token has the held generation: the equal-token race was set up")
	default:
		ev = append(ev, "the held partition was assigned generations before the replacement's (the group had moved on, keeping it): an ordinary takeover")
	}
	a.detail = strings.Join(ev, "; ")
	return a
}

// memberKey names a static member of one of the run's groups.
type memberKey struct{ group, instance string }

// members returns the member ids of the run's groups' static members.
func (h *harness) members(ctx context.Context) map[memberKey]string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out := map[memberKey]string{}
	groups := h.runGroups()
	gs, err := h.adm.DescribeGroups(ctx, groups...)
	if err != nil {
		return out
	}
	for _, g := range groups {
		for _, m := range gs[g].Members {
			if m.InstanceID != nil {
				out[memberKey{g, *m.InstanceID}] = m.MemberID
			}
		}
	}
	return out
}

// instancesIn counts the groups in which instance is a member.
func instancesIn(members map[memberKey]string, instance string) int {
	n := 0
	for k := range members {
		if k.instance == instance {
			n++
		}
	}
	return n
}

// twoTopicInbox is FaultTwoTopicInbox: with the commands routed to two destination topics and
// read by one receiver with one inbox, a worker (a member of the receiver's group too) is
// paused for two session timeouts, so its partitions of both topics move to other members and
// workers race through them. Proven by a key whose commands the receiver applied out of order
// across the two topics since the fault began.
func (h *harness) twoTopicInbox(ctx context.Context, f *Fault) {
	st := h.cfg.SessionTimeout
	var from int64
	_ = h.db.QueryRow(ctx, `SELECT COALESCE(max(id), 0) FROM chaos_commands`).Scan(&from)
	var n, inv int64
	var example string
	var paused []string
	// Up to three pauses (of workers picked at random) until an inversion is seen.
	for round := 0; round < 3 && inv == 0 && ctx.Err() == nil; round++ {
		p := h.pick(ctx)
		if p == nil {
			break
		}
		paused = append(paused, p.id)
		_ = p.cmd.Process.Signal(syscall.SIGSTOP)
		sleep(ctx, 2*st)
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		deadline := time.Now().Add(3*st + 5*time.Second)
		for time.Now().Before(deadline) && ctx.Err() == nil {
			if n, inv, example = h.inversions(ctx, from); inv > 0 {
				break
			}
			sleep(ctx, 250*time.Millisecond)
		}
	}
	if len(paused) == 0 {
		f.Detail = "no worker alive"
		return
	}
	f.Target = strings.Join(paused, ",")
	f.Bit = inv > 0
	f.Detail = fmt.Sprintf("%s paused %s each; %d commands applied since, %d read out of order across the two topics", f.Target, 2*st, n, inv)
	if example != "" {
		f.Detail += " (" + example + ")"
	}
}

// inversions counts the commands applied after id from whose key a later command had already
// come through the other destination topic.
func (h *harness) inversions(ctx context.Context, from int64) (n, inv int64, example string) {
	rows, err := h.db.Query(ctx, `SELECT k, seq, topic FROM chaos_commands WHERE id > $1 ORDER BY id`, from)
	if err != nil {
		return 0, 0, ""
	}
	defer rows.Close()
	type last struct {
		seq   int64
		topic string
	}
	top := map[string]last{}
	for rows.Next() {
		var k, topic string
		var seq int64
		if rows.Scan(&k, &seq, &topic) != nil {
			return n, inv, example
		}
		n++
		if m, ok := top[k]; ok && seq < m.seq && m.topic != topic {
			inv++
			if example == "" {
				example = fmt.Sprintf("key %s: seq %d from %s after seq %d from %s", k, seq, topic, m.seq, m.topic)
			}
		}
		if m, ok := top[k]; !ok || seq > m.seq {
			top[k] = last{seq, topic}
		}
	}
	return n, inv, example
}

// scriptOutput runs a deploy/local script and returns its standard output.
func (h *harness) scriptOutput(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(h.cfg.DeployDir, name), args...)
	cmd.Env = append(os.Environ(), h.cfg.ScriptEnv...)
	out, err := cmd.Output()
	return string(out), err
}
