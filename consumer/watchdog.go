package consumer

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel/metric"
)

// The watchdog stops the work of a member whose group session expired while it was busy.
//
// franz-go learns that its session expired only from the coordinator's answer to a
// heartbeat. A member cut off from the coordinator (a frozen network, a stalled link) gets
// no answer: its heartbeat hangs until the request times out and is retried, and meanwhile
// its workers go on applying what they had fetched, calling remote services from their
// handlers, long after the group gave the partitions to another member. The fence keeps
// the data right (their writes are refused once the new owner claims), but the work is
// wasted and its side effects outside the sink are not fenced.
//
// The watchdog watches the client's requests through franz-go hooks and keeps the latest
// moment the coordinator is known to have refreshed the session: when the answer to a
// heartbeat (or a JoinGroup, SyncGroup, OffsetCommit or KIP-848 ConsumerGroupHeartbeat)
// began to arrive. The coordinator processed that request before answering it, so its
// session deadline is at most that moment plus the session timeout: when that deadline
// passes with no newer answer, the session has expired at the coordinator (the watchdog
// never fires on a live session, up to the coordinator and this process measuring time at
// the same rate). It then cancels every partition's context at once and pauses their
// fetching, counts the partitions (baton.consumer.watchdog.stops) and logs once at ERROR.
// A worker checks its context before each batch, so no batch starts after that.
//
// While a JoinGroup or SyncGroup is in flight the coordinator keeps the member (it is
// waiting for the rebalance, which may outlast the session timeout): the watchdog does not
// fire then.
//
// What happens next is franz-go's: when the network comes back, the coordinator's answer
// (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION) makes it call OnPartitionsLost, which removes the
// stopped workers, and it rejoins. Should a partition stay assigned (the member was not
// expelled after all) for a heartbeat interval after the first answer, its worker is
// restarted (revive): it claims again under its old claimant and epoch, and verifies with the
// coordinator before any write, like any claim.
type watchdog struct {
	session, interval time.Duration

	mu      sync.Mutex
	last    time.Time // the latest answer that refreshed the session
	pending int       // JoinGroup and SyncGroup requests written and not yet answered
	fired   bool      // the session expired and the partitions were stopped
	firedAt time.Time // last when the watchdog fired
	poke    chan struct{}

	// skew is added to the clock the session is judged by (not to the times recorded) until
	// the watchdog fires, which resets it. Only tests set it (export_test.go), to make the
	// watchdog fire once on a live session (a false expiry) and see it revive.
	skew atomic.Int64
}

var (
	_ kgo.HookBrokerWrite = (*watchdog)(nil)
	_ kgo.HookBrokerE2E   = (*watchdog)(nil)
)

func newWatchdog() *watchdog {
	return &watchdog{poke: make(chan struct{}, 1)}
}

// refreshes reports whether an answer to a request of this key refreshes the member's
// session at the coordinator.
func refreshes(key int16) bool {
	switch kmsg.Key(key) {
	case kmsg.Heartbeat, kmsg.JoinGroup, kmsg.SyncGroup, kmsg.OffsetCommit, kmsg.ConsumerGroupHeartbeat:
		return true
	}
	return false
}

// waits reports whether the coordinator keeps the member alive while a request of this key
// is in flight.
func waits(key int16) bool {
	return kmsg.Key(key) == kmsg.JoinGroup || kmsg.Key(key) == kmsg.SyncGroup
}

// OnBrokerWrite counts the JoinGroup and SyncGroup requests written.
func (d *watchdog) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if err != nil || !waits(key) {
		return
	}
	d.mu.Lock()
	d.pending++
	d.mu.Unlock()
	d.wake()
}

// OnBrokerE2E sees every request's answer (or its write or read failure).
func (d *watchdog) OnBrokerE2E(_ kgo.BrokerMetadata, key int16, e kgo.BrokerE2E) {
	if !refreshes(key) {
		return
	}
	at := time.Now().Add(-e.TimeToRead) // when the answer began to arrive
	d.mu.Lock()
	if waits(key) && e.WriteErr == nil && d.pending > 0 {
		d.pending--
	}
	if e.Err() == nil && at.After(d.last) {
		d.last = at
	}
	d.mu.Unlock()
	d.wake()
}

func (d *watchdog) wake() {
	select {
	case d.poke <- struct{}{}:
	default:
	}
}

// watch runs until ctx ends: it fires expire when the session has expired with partitions
// assigned, and revive when a partition stayed assigned for an interval after the
// coordinator answered again.
func (d *watchdog) watch(ctx context.Context, expire func(since time.Duration), revive func()) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	var reviveAt time.Time
	for {
		d.mu.Lock()
		now := time.Now().Add(time.Duration(d.skew.Load()))
		var wait time.Duration = -1
		switch {
		case d.fired && d.last.After(d.firedAt):
			// The coordinator answered again. franz-go calls OnPartitionsLost at once if the
			// member was expelled; give it an interval before restarting what it did not take.
			if reviveAt.IsZero() {
				reviveAt = now.Add(d.interval)
			}
			if wait = reviveAt.Sub(now); wait <= 0 {
				d.fired, reviveAt = false, time.Time{}
				d.mu.Unlock()
				revive()
				continue
			}
		case d.fired || d.last.IsZero() || d.pending > 0:
		default:
			deadline := d.last.Add(d.session)
			if wait = deadline.Sub(now); wait <= 0 {
				d.skew.Store(0)
				d.fired = true
				d.firedAt = d.last
				since := now.Sub(d.last)
				d.mu.Unlock()
				expire(since)
				continue
			}
		}
		d.mu.Unlock()
		if wait < 0 {
			wait = time.Hour
		}
		t.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-d.poke:
			if !t.Stop() {
				select {
				case <-t.C:
				default:
				}
			}
		case <-t.C:
		}
	}
}

// watchSession starts the run's watchdog over cl's session timeout and heartbeat interval;
// the returned function stops it and waits for it.
func (r *run[Tx]) watchSession(cl *kgo.Client, d *watchdog) (stop func()) {
	d.session, _ = cl.OptValue(kgo.SessionTimeout).(time.Duration)
	d.interval, _ = cl.OptValue(kgo.HeartbeatInterval).(time.Duration)
	ctx, cancel := context.WithCancel(r.ctx)
	done := make(chan struct{})
	if !watches(r.c.cfg.protocol, d.session) {
		close(done)
		return cancel
	}
	stops := r.c.m.stops
	go func() {
		defer close(done)
		d.watch(ctx, func(since time.Duration) { r.expire(ctx, since, stops) }, r.revive)
	}()
	return func() { cancel(); <-done }
}

// expire stops every partition at once: cancelled (the handler's ctx too) and paused.
func (r *run[Tx]) expire(ctx context.Context, since time.Duration, stops metric.Int64Counter) {
	r.mu.Lock()
	parts := map[string][]int32{}
	n := 0
	for id, w := range r.workers {
		if w.removed || w.expired {
			continue
		}
		w.expired = true
		w.cancel()
		r.setPause(w, pauseWatchdog, true)
		parts[id.Topic] = append(parts[id.Topic], id.Partition)
		if stops != nil {
			stops.Add(ctx, 1, r.c.m.part(id))
		}
		n++
	}
	r.mu.Unlock()
	if n > 0 {
		r.c.log.Error("group session expired: no heartbeat answered for longer than the session timeout; every partition stopped until the group reassigns them",
			"since_last_answer", since.Round(time.Millisecond), "partitions", parts)
	}
}

// revive restarts the workers the watchdog stopped whose partitions are still assigned to
// this member: the coordinator answered again and franz-go did not take them away. The new
// worker is the same claimant at the same epoch, started only after the old one returned (no
// two incarnations of one claimant run at once); it claims and verifies before any write. A
// worker that a revoke, a loss, a reassignment or Run's end picked to stop is never revived,
// whichever of the two takes run.mu first after it returns (so the rebalance barrier holds);
// a revived worker with no position in the sink seeks back to the first record its
// predecessors were handed, which the client's fetch cursor has passed.
func (r *run[Tx]) revive() {
	r.mu.Lock()
	var olds []*worker[Tx]
	for _, w := range r.workers {
		if w.expired && !w.removed && !w.stopping {
			olds = append(olds, w)
		}
	}
	r.mu.Unlock()
	var started []*worker[Tx]
	for _, old := range olds {
		<-old.done
		r.mu.Lock()
		if old.removed || old.stopping || r.workers[old.id] != old {
			r.mu.Unlock()
			continue
		}
		started = append(started, r.successor(old))
		r.mu.Unlock()
	}
	for _, w := range started {
		r.wg.Add(1)
		go w.run()
	}
	if len(started) > 0 {
		r.c.log.Warn("group session answered again and the partitions stayed assigned: restarted them", "partitions", len(started))
	}
}

// successor replaces old, which has returned, with a new worker of the same claimant at the
// same epoch, on old's fetch cursor (revive, retryRefused); the caller holds r.mu. Fetching
// stays paused (by the watchdog, or by the old worker's idle) until claimResolved seeks to the
// sink's position; paused here too, should old have been stopped before it paused.
func (r *run[Tx]) successor(old *worker[Tx]) *worker[Tx] {
	old.removed = true
	r.release(old)
	w := newWorker(r, old.id, old.cs.Epoch)
	w.claimant, w.late, w.revived, w.from = old.claimant, true, true, old.from
	w.applied.Store(old.applied.Load())
	w.hwm.Store(old.hwm.Load())
	r.workers[old.id] = w
	r.setPause(w, pauseClaiming, true)
	return w
}

// watches reports whether the watchdog judges a group of this protocol with this client
// session timeout. A KIP-848 group's session timeout and heartbeat interval are the broker's
// (group.consumer.session.timeout.ms), and the client is never told the session timeout:
// judged by the client's values, the watchdog would fire on a live session or late. It
// watches classic groups only.
func watches(protocol string, session time.Duration) bool {
	return session > 0 && protocol != protocolConsumer
}
