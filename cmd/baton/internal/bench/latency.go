package bench

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Latency is a worker's end-to-end latency over its steady window: for every record produced
// at least Job.Warmup after the design's first commit, the time from its produce timestamp
// (set by the producer's client when it was handed the record, in milliseconds) to the moment
// the transaction holding it returned from its commit, taken in the worker.
type Latency struct {
	Records       int64         `json:"records"` // records in the window
	Window        time.Duration `json:"window"`  // from the window's start to its last commit
	P50, P99, Max time.Duration
	// CommitP50 and CommitP99 are of the window's transactions, begin to commit (the sink's
	// Apply); Batches is how many there were.
	CommitP50, CommitP99 time.Duration
	Batches              int
	// Unstamped counts committed records whose fetch the worker did not see (none expected).
	Unstamped int64 `json:"unstamped,omitempty"`
}

// Rate is the window's records per second.
func (l Latency) Rate() float64 { return float64(l.Records) / l.Window.Seconds() }

// Batch is the window's mean records per transaction.
func (l Latency) Batch() float64 {
	if l.Batches == 0 {
		return 0
	}
	return float64(l.Records) / float64(l.Batches)
}

// latencies collects a latency run's samples in the worker.
type latencies struct {
	warmup    time.Duration
	mu        sync.Mutex
	stamps    map[int32]map[int64]time.Time // partition -> offset -> produce timestamp, fetched and not yet committed
	samples   []time.Duration
	commits   []time.Duration
	from      time.Time // the window's start: the first commit + warmup
	last      time.Time // the window's last commit
	unstamped int64
}

func newLatencies(warmup time.Duration) *latencies {
	return &latencies{warmup: warmup, stamps: map[int32]map[int64]time.Time{}}
}

// stamp notes the produce timestamp of a fetched record.
func (l *latencies) stamp(r *kgo.Record) {
	l.mu.Lock()
	m := l.stamps[r.Partition]
	if m == nil {
		m = map[int64]time.Time{}
		l.stamps[r.Partition] = m
	}
	m[r.Offset] = r.Timestamp
	l.mu.Unlock()
}

// landed counts the records of partition p at offsets from..to, committed at now by a
// transaction that took d; first is the design's first commit.
func (l *latencies) landed(first time.Time, p int32, from, to int64, d time.Duration, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.from.IsZero() {
		l.from = first.Add(l.warmup)
	}
	m := l.stamps[p]
	steady := false
	for o := from; o <= to; o++ {
		ts, ok := m[o]
		if !ok {
			l.unstamped++
			continue
		}
		delete(m, o)
		if ts.Before(l.from) {
			continue
		}
		l.samples = append(l.samples, now.Sub(ts))
		steady = true
	}
	if steady {
		l.commits = append(l.commits, d)
		l.last = now
	}
}

// seen counts records read at now (a design that writes nothing: kafka-read), by their
// produce timestamps; d is the poll's duration.
func (l *latencies) seen(first time.Time, ts []time.Time, d time.Duration, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.from.IsZero() {
		l.from = first.Add(l.warmup)
	}
	steady := false
	for _, t := range ts {
		if !t.Before(l.from) {
			l.samples = append(l.samples, now.Sub(t))
			steady = true
		}
	}
	if steady {
		l.commits = append(l.commits, d)
		l.last = now
	}
}

func (l *latencies) result() *Latency {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := &Latency{Records: int64(len(l.samples)), Batches: len(l.commits), Unstamped: l.unstamped}
	if len(l.samples) == 0 {
		return out
	}
	out.Window = l.last.Sub(l.from)
	s := slices.Clone(l.samples)
	slices.Sort(s)
	out.P50, out.P99, out.Max = s[len(s)/2], s[len(s)*99/100], s[len(s)-1]
	c := slices.Clone(l.commits)
	slices.Sort(c)
	out.CommitP50, out.CommitP99 = c[len(c)/2], c[len(c)*99/100]
	return out
}

// firstAt marks now as the first commit if none was marked, and returns the first commit.
func (r *Recorder) firstAt(now time.Time) time.Time {
	r.first.CompareAndSwap(nil, &now)
	return *r.first.Load()
}

// CommittedRange records one committed transaction that took d and applied the records of
// partition p at offsets from..to: [Recorder.Committed], and with Job.Latency each record's
// latency. Call it right after the commit returned.
func (r *Recorder) CommittedRange(p int32, from, to int64, d time.Duration) {
	now := time.Now()
	first := r.firstAt(now)
	if r.e2e != nil {
		r.e2e.landed(first, p, from, to, d, now)
	}
	r.Committed(to-from+1, d)
}

// Seen records a poll that took d and read recs, for a design that writes nothing: its
// "commit" is the poll's return ([Recorder.Committed]), and with Job.Latency each record's
// latency runs to it.
func (r *Recorder) Seen(recs []*kgo.Record, d time.Duration) {
	now := time.Now()
	first := r.firstAt(now)
	if r.e2e != nil {
		ts := make([]time.Time, len(recs))
		for i, rec := range recs {
			ts[i] = rec.Timestamp
		}
		r.e2e.seen(first, ts, d, now)
	}
	r.Committed(int64(len(recs)), d)
}

func (r *Recorder) latency() *Latency {
	if r.e2e == nil {
		return nil
	}
	return r.e2e.result()
}

// Phase is a moment before a design's first commit, from Recorder.Start.
type Phase struct {
	Name string        `json:"name"`
	At   time.Duration `json:"at"`
}

type phaseAt struct {
	name string
	at   time.Time
}

// Phase notes that the phase name was reached now, if the design has not committed yet: the
// first time (last false) or every time, the latest kept (last true).
func (r *Recorder) Phase(name string, last bool) {
	if r.first.Load() != nil {
		return
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.phases {
		if r.phases[i].name == name {
			if last {
				r.phases[i].at = now
			}
			return
		}
	}
	r.phases = append(r.phases, phaseAt{name, now})
}

// phaseList returns the phases from Recorder.Start, in time order, with the first commit.
func (r *Recorder) phaseList() []Phase {
	s, f := r.started.Load(), r.first.Load()
	r.mu.Lock()
	defer r.mu.Unlock()
	if s == nil || len(r.phases) == 0 {
		return nil
	}
	var out []Phase
	for _, p := range r.phases {
		out = append(out, Phase{p.name, p.at.Sub(*s)})
	}
	if f != nil {
		out = append(out, Phase{PhaseFirstCommit, f.Sub(*s)})
	}
	slices.SortStableFunc(out, func(a, b Phase) int { return int(a.At - b.At) })
	return out
}

// The phases a consumer design reports (Report.Phases), in their usual order.
const (
	PhaseJoined      = "joined"         // the SyncGroup response: the group joined, partitions assigned
	PhaseClaimed     = "fences claimed" // the last partition's fence claimed in the sink
	PhaseProved      = "proved"         // the last ownership proof's DescribeGroups response
	PhaseListed      = "start offsets"  // the ListOffsets response: the client's start offsets
	PhaseFetched     = "first fetch"    // the first fetched batch decoded
	PhaseApplying    = "first apply"    // the first transaction begun (the sink's Apply called)
	PhaseFirstCommit = "first commit"
)

// ConsumerTiming returns the Kafka options that time a consumer design (the phases before its
// first commit, and with Latency each fetched record's produce timestamp, for
// [Recorder.CommittedRange]) and its fetch settings ([Job.FetchOpts]).
func (j Job) ConsumerTiming(rec *Recorder) []kgo.Opt {
	opts := []kgo.Opt{kgo.WithHooks(phaseHook{rec})}
	if j.Latency {
		opts = append(opts, kgo.WithHooks(stampHook{rec}))
	}
	return append(opts, j.FetchOpts()...)
}

// FetchOpts returns the settings that differ from franz-go's defaults, as kgo options.
func (j FetchSettings) FetchOpts() []kgo.Opt {
	var opts []kgo.Opt
	if j.FetchMaxWait > 0 {
		opts = append(opts, kgo.FetchMaxWait(j.FetchMaxWait))
	}
	if j.FetchMaxBytes > 0 {
		opts = append(opts, kgo.FetchMaxBytes(j.FetchMaxBytes))
	}
	if j.FetchMaxPartitionBytes > 0 {
		opts = append(opts, kgo.FetchMaxPartitionBytes(j.FetchMaxPartitionBytes))
	}
	return opts
}

// phaseHook notes the Kafka phases before the first commit.
type phaseHook struct{ rec *Recorder }

// Kafka's request keys.
const (
	keyListOffsets    = 2
	keySyncGroup      = 14
	keyDescribeGroups = 15
)

func (h phaseHook) OnBrokerRead(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if err != nil {
		return
	}
	switch key {
	case keySyncGroup:
		h.rec.Phase(PhaseJoined, false)
	case keyDescribeGroups:
		h.rec.Phase(PhaseProved, true)
	case keyListOffsets:
		h.rec.Phase(PhaseListed, false)
	}
}

func (h phaseHook) OnFetchBatchRead(kgo.BrokerMetadata, string, int32, kgo.FetchBatchMetrics) {
	h.rec.Phase(PhaseFetched, false)
}

// stampHook notes each fetched record's produce timestamp.
type stampHook struct{ rec *Recorder }

func (h stampHook) OnFetchRecordBuffered(r *kgo.Record) {
	if h.rec.e2e != nil {
		h.rec.e2e.stamp(r)
	}
}

// PhaseLine is phases as "joined 40ms, fences claimed 61ms, ...".
func PhaseLine(phases []Phase) string {
	var b []byte
	for i, p := range phases {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = fmt.Appendf(b, "%s %.0fms", p.Name, ms(p.At))
	}
	return string(b)
}
