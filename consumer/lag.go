package consumer

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"go.opentelemetry.io/otel/metric"
)

// unknownPosition is a worker's applied position for the lag gauge before anything told it.
const unknownPosition = math.MinInt64

// missingTopicEvery bounds how often a consumed topic that does not exist is logged at ERROR
// while it stays missing.
const missingTopicEvery = time.Minute

// setPosition sets the sink's position the worker goes on from, and shows it to the lag gauge.
func (w *worker[Tx]) setPosition(p int64) {
	w.position = p
	w.applied.Store(p)
}

// seeHWM records a high watermark the brokers reported for w's partition. The highest one
// seen wins: a fetch and an end-offset listing may answer out of order.
func (w *worker[Tx]) seeHWM(hwm int64) {
	for {
		cur := w.hwm.Load()
		if hwm <= cur || w.hwm.CompareAndSwap(cur, hwm) {
			return
		}
	}
}

// lag returns the records of w's partition the sink has not applied: its high watermark minus
// the next offset to apply (the sink's position + 1, or the log start if later), and false when
// the high watermark is not known yet.
func (w *worker[Tx]) lag() (int64, bool) {
	hwm := w.hwm.Load()
	if hwm < 0 {
		return 0, false
	}
	next := w.logStart.Load()
	if p := w.applied.Load(); p != unknownPosition {
		next = max(next, p+1)
	}
	return max(0, hwm-next), true
}

// observeLag is the lag gauge's callback: one series per partition this member owns now, so
// a revoked or lost partition's series ends with its worker.
func (r *run[Tx]) observeLag(_ context.Context, o metric.Observer) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, w := range r.workers {
		if w.removed || w.stopping {
			continue
		}
		if v, ok := w.lag(); ok {
			o.ObserveInt64(r.c.m.lag, v, r.c.m.part(id))
		}
	}
	return nil
}

// watchLag keeps the lag gauge true while records are not fetched: every lagLook it lists the
// end offsets of the consumed topics (fetching stops when a partition's worker is blocked, on
// a stalled sink say, and with it the high watermarks fetches bring), and for a partition whose
// position the sink has not told yet (its claim is waiting for the database) takes the group's
// committed offset as the estimate. The listing also finds consumed topics that do not exist,
// logged at ERROR at once and then every missingTopicEvery while they stay missing.
func (r *run[Tx]) watchLag() {
	defer r.wg.Done()
	t := time.NewTicker(r.c.cfg.lagLook)
	defer t.Stop()
	missing := map[string]time.Time{} // topic -> when its absence was last logged
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		}
		r.lookLag(missing)
	}
}

func (r *run[Tx]) lookLag(missing map[string]time.Time) {
	ctx, cancel := context.WithTimeout(r.ctx, r.c.cfg.lagLook)
	defer cancel()
	adm := kadm.NewClient(r.client())
	ends, err := adm.ListEndOffsets(ctx, r.c.topics...)
	if err != nil {
		r.c.log.Debug("listing end offsets failed", "err", err)
		return
	}
	unknown := false
	r.mu.Lock()
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			return
		}
		for id, w := range r.workers {
			if id.Topic == o.Topic && id.Partition == o.Partition {
				w.seeHWM(o.Offset)
				unknown = unknown || w.applied.Load() == unknownPosition
			}
		}
	})
	r.mu.Unlock()
	for _, topic := range r.c.topics {
		var err error
		if lo, ok := ends[topic][-1]; ok {
			err = lo.Err
		}
		if err == nil || !errors.Is(err, kerr.UnknownTopicOrPartition) {
			if _, was := missing[topic]; was && err == nil {
				delete(missing, topic)
				r.c.log.Info("consumed topic exists now", "topic", topic)
			}
			continue
		}
		if last, was := missing[topic]; was && time.Since(last) < missingTopicEvery {
			continue
		}
		missing[topic] = time.Now()
		r.c.log.Error("consumed topic does not exist: nothing of it is processed until it is created",
			"topic", topic, "err", err)
	}
	if !unknown {
		return
	}
	committed, err := adm.FetchOffsets(ctx, r.c.group)
	if err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, w := range r.workers {
		if c, ok := committed.Lookup(id.Topic, id.Partition); ok && c.Err == nil && c.At >= 0 {
			w.applied.CompareAndSwap(unknownPosition, c.At-1) // the worker's own position wins
		}
	}
}

// commitEvery is the least time between two commits of commitApplied: at most this many
// commit requests per second and member, whatever the batch rate.
const commitEvery = 100 * time.Millisecond

// commitApplied commits the marked offsets (the sink's positions + 1) to Kafka soon after each
// batch, so that the group's committed offsets, which kafka-consumer-groups, Burrow and KEDA
// read as the group's lag, follow the sink within about commitEvery plus a commit's round trip
// instead of franz-go's auto-commit interval (5s). One commit at a time; batches applied
// while one is in flight are committed by the next. A failed commit (a rebalance under way,
// the coordinator moving) is left to the next one, the auto-commit and the revoke's commit:
// resuming never reads these offsets.
func (r *run[Tx]) commitApplied() {
	defer r.wg.Done()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-r.applied:
		}
		ctx, cancel := context.WithTimeout(r.ctx, 10*time.Second)
		if err := r.client().CommitMarkedOffsets(ctx); err != nil && r.ctx.Err() == nil {
			r.c.log.Debug("commit of applied offsets failed; the next one retries", "err", err)
		}
		cancel()
		t := time.NewTimer(commitEvery)
		select {
		case <-r.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
