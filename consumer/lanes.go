package consumer

import (
	"context"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/lanes"
)

// preparer is the prepare stage of one partition under one token: [Lanes]' function bound to
// the fence key and the token of the worker that dispatched the record.
type preparer struct {
	fn func(ctx context.Context, k fence.Key, t fence.Token, r *kgo.Record) (any, error)
	k  fence.Key
	t  fence.Token
}

func (p preparer) Prepare(ctx context.Context, r *kgo.Record) (any, error) {
	return p.fn(ctx, p.k, p.t, r)
}

// preparer returns the prepare stage under w's current token.
func (w *worker[Tx]) preparer() preparer {
	return preparer{fn: w.r.c.cfg.prepare, k: w.key, t: w.token}
}

// maxLanes bounds [Lanes]; documented there.
const maxLanes = 256

// laneKey identifies a record's key; a nil key is its own key (Kafka tells nil from empty).
type laneKey struct {
	key  string
	null bool
}

// laneEntry is one fresh record of the window: fetched, not yet applied. Its fields are owned
// by the worker's goroutine; a lane reads only rec.
type laneEntry struct {
	rec  *kgo.Record
	lane int
	done bool
	val  any   // what Prepare returned
	err  error // Prepare's permanent error: the record is poison
}

// laneDone is a lane's report that Prepare of e returned (after its retries).
type laneDone struct {
	e   *laneEntry
	val any
	err error
}

// laneJob is one record for a lane, with the handler current when it was dispatched.
type laneJob struct {
	e *laneEntry
	p preparer
}

// laneBinding is a key's lane while it has records dispatched and not done.
type laneBinding struct {
	lane    int
	pending int
}

// laneRun is one run of lanes in a worker: the lanes' goroutines and the window's state, the
// latter owned by the worker's goroutine alone.
type laneRun[Tx any] struct {
	w      *worker[Tx]
	ctx    context.Context // the lanes' ctx: the partition's, cancelled when the run ends
	cancel context.CancelFunc
	wg     sync.WaitGroup
	jobs   []chan laneJob
	out    chan laneDone

	win         []*laneEntry // fresh records in offset order, not yet applied
	backlog     []*laneEntry // records of win not yet dispatched, in offset order
	tr          lanes.Tracker
	keys        map[laneKey]*laneBinding
	load        []int // per lane: dispatched and not done
	outstanding int
	limit       int // dispatched and not done, at most
}

// laneLoop is loop for a consumer with Lanes: the partition's records run Prepare in up to
// cfg.lanes lanes, and this goroutine, the partition's only writer, applies the contiguous
// prefix of prepared records in fenced transactions, as loop applies batches. It returns when
// the partition stops; every lane goroutine has returned by then.
//
// Why one writer: the fence and the sink's position are per partition and advance only
// contiguously (a batch's first offset must follow the stored position), so writes from lanes
// in parallel would either serialize on the fence row anyway or need a per-key fence; the
// slow part is the remote call, which runs in the lanes, so the writer's transactions stay
// short and batch many records.
func (w *worker[Tx]) laneLoop() {
	limit := w.r.c.cfg.maxInflightPart
	l := &laneRun[Tx]{w: w, keys: map[laneKey]*laneBinding{}, limit: limit,
		load: make([]int, w.r.c.cfg.lanes), out: make(chan laneDone, limit)}
	l.ctx, l.cancel = context.WithCancel(w.ctx)
	for range w.r.c.cfg.lanes {
		jobs := make(chan laneJob, limit) // never full: at most limit records are dispatched
		l.jobs = append(l.jobs, jobs)
		l.wg.Go(func() { l.lane(jobs) })
	}
	defer func() {
		l.cancel()
		for _, j := range l.jobs {
			close(j)
		}
		l.wg.Wait() // the barrier: no lane outlives the partition's goroutine
		if len(l.win) > 0 {
			w.r.done(w, int64(len(l.win)))
		}
	}()

	var idle <-chan time.Time
	if w.r.c.cfg.afterCommit != nil {
		t := time.NewTicker(w.r.c.cfg.afterCommitIdle)
		defer t.Stop()
		idle = t.C
		if !w.afterCommit() {
			return
		}
	}
	for {
		applied, ok := l.applyPrefix()
		if !ok {
			return
		}
		if applied && w.r.c.cfg.afterCommit != nil && !w.afterCommit() {
			return
		}
		p := w.preparer() // under the current token: a resettle may have changed it
		l.dispatch(p)
		select {
		case <-w.ctx.Done():
			return
		case <-idle:
			if !w.afterCommit() {
				return
			}
		case recs := <-w.in:
			l.intake(recs)
		case d := <-l.out:
			l.complete(d)
			// Take every completion already reported: one transaction for all of them.
		more:
			for {
				select {
				case d := <-l.out:
					l.complete(d)
				default:
					break more
				}
			}
		}
	}
}

// lane runs Prepare for the records sent to it, in the order sent, until its channel is
// closed; once the lanes' ctx is cancelled it only drains.
func (l *laneRun[Tx]) lane(jobs <-chan laneJob) {
	for j := range jobs {
		if l.ctx.Err() != nil {
			continue
		}
		val, err := l.prepare(j)
		l.out <- laneDone{e: j.e, val: val, err: err} // never blocks: out holds every dispatched record
	}
}

// prepare calls Prepare for one record, retrying transient failures with bounded exponential
// backoff on this lane (the key's later records, and the other keys of this lane, wait behind
// it, as a partition waits behind a retried batch). A call that has not returned after
// stalledAfter is logged at ERROR, as a step's is (slowCall).
func (l *laneRun[Tx]) prepare(j laneJob) (any, error) {
	w := l.w
	backoff := w.r.c.cfg.retryMin
	for n := 1; ; n++ {
		slow := w.slowCall("prepare", n, "offset", j.e.rec.Offset)
		val, err := j.p.Prepare(l.ctx, j.e.rec)
		slow.Stop()
		if err == nil || IsPermanent(err) || l.ctx.Err() != nil {
			return val, err
		}
		w.r.c.m.retries.Add(l.ctx, 1, w.r.c.m.outcome(w.id, "prepare"))
		w.r.c.log.Warn("transient failure; record's lane stalled, retrying",
			append(w.log(), "op", "prepare", "offset", j.e.rec.Offset, "attempt", n, "backoff", backoff, "err", err)...)
		t := time.NewTimer(backoff)
		select {
		case <-l.ctx.Done():
			t.Stop()
			return nil, l.ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, w.r.c.cfg.retryMax)
	}
}

// intake adds fetched records to the window: those the sink already holds are skipped, as
// are records at or below one already taken (a fetch that raced a seek).
func (l *laneRun[Tx]) intake(recs []*kgo.Record) {
	w := l.w
	var dup, skipped int64
	for _, r := range recs {
		if r.Offset <= w.position {
			dup++
			continue
		}
		if err := l.tr.Start(r.Offset); err != nil {
			skipped++
			continue
		}
		e := &laneEntry{rec: r}
		l.win = append(l.win, e)
		l.backlog = append(l.backlog, e)
	}
	if dup > 0 {
		w.r.c.m.duplicates.Add(w.ctx, dup, w.r.c.m.part(w.id))
	}
	if dup+skipped > 0 {
		w.r.done(w, dup+skipped)
	}
}

// dispatch sends backlog records to lanes while fewer than limit are outstanding. A key with
// records outstanding stays on its lane, so its records run one after another in offset
// order; a key with none goes to the least loaded lane (keys, not hashes, are balanced: a few
// hot keys cannot share one lane while another idles).
func (l *laneRun[Tx]) dispatch(p preparer) {
	for len(l.backlog) > 0 && l.outstanding < l.limit {
		e := l.backlog[0]
		l.backlog[0] = nil
		l.backlog = l.backlog[1:]
		k := laneKey{key: string(e.rec.Key), null: e.rec.Key == nil}
		b := l.keys[k]
		if b == nil {
			b = &laneBinding{lane: l.leastLoaded()}
			l.keys[k] = b
		}
		b.pending++
		e.lane = b.lane
		l.load[b.lane]++
		l.outstanding++
		l.jobs[b.lane] <- laneJob{e: e, p: p}
	}
	if len(l.backlog) == 0 {
		l.backlog = nil // let the consumed array go
	}
}

func (l *laneRun[Tx]) leastLoaded() int {
	best := 0
	for i, n := range l.load {
		if n < l.load[best] {
			best = i
		}
	}
	return best
}

// complete records a lane's report. A report of a cancelled Prepare (the partition is
// stopping) completes nothing: the record stays unapplied.
func (l *laneRun[Tx]) complete(d laneDone) {
	e := d.e
	l.outstanding--
	l.load[e.lane]--
	k := laneKey{key: string(e.rec.Key), null: e.rec.Key == nil}
	if b := l.keys[k]; b != nil {
		if b.pending--; b.pending == 0 {
			delete(l.keys, k)
		}
	}
	if d.err != nil && !IsPermanent(d.err) {
		return // cancelled: the run is ending
	}
	e.done, e.val, e.err = true, d.val, d.err
	_ = l.tr.Done(e.rec.Offset) // started at intake, done once
}

// applyPrefix applies the window's contiguous prefix of prepared records: the records up to
// the tracker's committable offset, never one past a record still in a lane, so the sink's
// position never passes a record that was not applied. Poison records (a permanent Prepare
// error) are dead-lettered in their place. It reports whether anything was applied, and false
// when the partition must stop.
func (l *laneRun[Tx]) applyPrefix() (applied, ok bool) {
	w := l.w
	c := l.tr.Committable()
	i := 0
	for i < len(l.win) && l.win[i].rec.Offset <= c {
		i++
	}
	prefix := l.win[:i]
	l.win = l.win[i:]
	if len(prefix) == 0 {
		return false, true
	}
	if w.prepared == nil {
		w.prepared = map[int64]any{}
	}
	for _, e := range prefix {
		if e.err == nil {
			w.prepared[e.rec.Offset] = e.val
		}
	}
	defer clear(w.prepared)
	left := int64(len(prefix))
	defer func() {
		if left > 0 { // the partition stopped: release what was not applied
			w.r.done(w, left)
		}
	}()
	run := make([]*kgo.Record, 0, min(len(prefix), l.limit))
	flush := func() bool {
		for len(run) > 0 {
			m := min(len(run), l.limit)
			ok := w.process(run[:m:m])
			run = run[m:]
			left -= int64(m)
			w.r.done(w, int64(m))
			if !ok {
				return false
			}
		}
		run = run[:0]
		return true
	}
	for _, e := range prefix {
		if e.err == nil {
			run = append(run, e.rec)
			continue
		}
		if !flush() {
			return true, false
		}
		ok := w.deadLetter(e.rec, e.err)
		left--
		w.r.done(w, 1)
		if !ok {
			return true, false
		}
	}
	return true, flush()
}
