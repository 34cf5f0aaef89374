package consumer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/partition"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// worker owns one assigned partition: its claim, its handler, its position. Its fields after
// "owned by the goroutine" are touched only by run's goroutine; the registry fields are
// guarded by run.mu.
type worker[Tx any] struct {
	r        *run[Tx]
	id       partition.ID
	key      fence.Key
	epoch    int64
	claimant string // this worker incarnation's identity at the sink: member id + "/" + random

	ctx     context.Context
	cancel  context.CancelFunc
	in      chan []*kgo.Record
	done    chan struct{} // closed when the goroutine has returned
	claimed chan struct{} // closed when the claim is resolved, either way

	// Registry fields, guarded by run.mu.
	removed   bool
	late      bool // the assignment callback stopped waiting for the claim
	claimDone bool
	pause     int

	paused   atomic.Bool  // pause != 0, readable without run.mu
	inflight atomic.Int64 // records handed to this worker and not yet done

	// Owned by the goroutine.
	token    fence.Token
	position int64
	handler  Handler[Tx]
}

func newWorker[Tx any](r *run[Tx], id partition.ID, epoch int64) *worker[Tx] {
	ctx, cancel := context.WithCancel(r.ctx)
	member, _ := r.client().GroupMetadata()
	return &worker[Tx]{
		r: r, id: id, epoch: epoch, claimant: newClaimant(member),
		key:    id.Key(r.c.group),
		ctx:    ctx,
		cancel: cancel,
		// Backpressure pauses the partition at maxInflightPart records, so this many
		// batches (each at least one record) plus one fetch's worth never block the poller.
		in:       make(chan []*kgo.Record, r.c.cfg.maxInflightPart+16),
		done:     make(chan struct{}),
		claimed:  make(chan struct{}),
		position: fence.NoPosition,
	}
}

func (w *worker[Tx]) log() []any {
	return []any{"topic", w.id.Topic, "partition", w.id.Partition}
}

func (w *worker[Tx]) run() {
	defer w.r.wg.Done()
	defer close(w.done)
	ok := w.claim()
	w.r.claimResolved(w, ok)
	close(w.claimed)
	if !ok {
		w.idle()
		return
	}
	h, err := w.r.c.factory(w.ctx, w.key, w.token)
	if err != nil {
		if w.ctx.Err() == nil {
			w.r.c.log.Error("handler factory failed; stopping", append(w.log(), "err", err)...)
			w.r.fail(fmt.Errorf("consumer: factory for %s: %w", w.key, err))
		}
		w.idle()
		return
	}
	w.handler = h
	w.loop()
	w.idle()
}

// idle drops whatever still arrives until the partition is revoked or lost, keeping the
// in-flight accounting right. The partition's fetching is paused meanwhile.
func (w *worker[Tx]) idle() {
	if w.ctx.Err() == nil {
		w.r.mu.Lock()
		w.r.setPause(w, pauseIdle, true)
		w.r.mu.Unlock()
	}
	for {
		select {
		case <-w.ctx.Done():
			return
		case recs := <-w.in:
			w.r.done(w, int64(len(recs)))
		}
	}
}

func (w *worker[Tx]) loop() {
	limit := w.r.c.cfg.maxInflightPart
	var idle <-chan time.Time
	if w.r.c.cfg.afterCommit != nil {
		t := time.NewTicker(w.r.c.cfg.afterCommitIdle)
		defer t.Stop()
		idle = t.C
		w.afterCommit() // work left by an earlier owner (e.g. outbox rows not yet relayed)
	}
	for {
		var recs []*kgo.Record
		select {
		case <-w.ctx.Done():
			return
		case <-idle:
			w.afterCommit()
			continue
		case recs = <-w.in:
		}
		n := len(recs)
		// Coalesce what is already queued: one transaction for a longer run of records.
	more:
		for len(recs) < limit {
			select {
			case next := <-w.in:
				recs = append(recs, next...)
				n += len(next)
			default:
				break more
			}
		}
		// A single fetch can bring far more than limit records of one partition: apply them
		// in transactions of at most limit records, so one batch holds the fence (and delays
		// a revoke) no longer than a bounded batch takes.
		for len(recs) > 0 {
			m := min(len(recs), limit)
			ok := w.process(recs[:m:m])
			recs = recs[m:]
			n -= m
			w.r.done(w, int64(m))
			if !ok {
				w.r.done(w, int64(n))
				return
			}
		}
		if w.r.c.cfg.afterCommit != nil {
			w.afterCommit()
		}
	}
}

// afterCommit runs the AfterCommit hook in the partition's goroutine, under its token.
func (w *worker[Tx]) afterCommit() {
	if w.ctx.Err() != nil {
		return
	}
	err := w.r.c.cfg.afterCommit(w.ctx, w.key, w.token)
	if err != nil && w.ctx.Err() == nil {
		w.r.c.m.retries.Add(w.ctx, 1, withOutcome(w.id, "after-commit"))
		w.r.c.log.Warn("after-commit hook failed; retried after the next commit or idle interval", append(w.log(), "err", err)...)
	}
}

// process applies recs, skipping those the sink already holds. It returns false when the
// partition must stop (stale, or cancelled by a revoke).
func (w *worker[Tx]) process(recs []*kgo.Record) bool {
	fresh := recs[:0:0]
	for _, r := range recs {
		if r.Offset > w.position {
			fresh = append(fresh, r)
		}
	}
	if d := len(recs) - len(fresh); d > 0 {
		w.r.c.m.duplicates.Add(w.ctx, int64(d), partAttrs(w.id))
	}
	if len(fresh) == 0 {
		return true
	}
	return w.apply(fresh)
}

// apply applies recs in one fenced transaction, retrying transient failures, splitting the
// batch around a poison record.
func (w *worker[Tx]) apply(recs []*kgo.Record) bool {
	last := recs[len(recs)-1]
	err := w.attempt("apply", func() error { return w.applyOnce(recs) })
	switch {
	case err == nil:
		return true
	case errors.Is(err, fence.ErrDuplicate):
		// Already applied (a retried commit that had succeeded): skip it.
		w.r.c.m.duplicates.Add(w.ctx, int64(len(recs)), partAttrs(w.id))
		w.advanced(last)
		return true
	case errors.Is(err, fence.ErrStale):
		w.refused(err)
		return false
	case IsPermanent(err) && w.ctx.Err() == nil:
		return w.poison(recs, err)
	default:
		// Cancelled (revoked or lost): attempt returns nothing else.
		return false
	}
}

func (w *worker[Tx]) applyOnce(recs []*kgo.Record) error {
	last := recs[len(recs)-1]
	ctx, span := w.r.c.tracer.Start(w.ctx, "baton.apply "+w.id.Topic,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithLinks(producerLinks(w.r.c.cfg.propagator, recs)...),
		trace.WithAttributes(
			attribute.String("messaging.destination.name", w.id.Topic),
			attribute.Int("messaging.destination.partition.id", int(w.id.Partition)),
			attribute.String("baton.token", w.token.String()),
			attribute.Int64("baton.first_offset", recs[0].Offset),
			attribute.Int64("baton.last_offset", last.Offset),
			attribute.Int("messaging.batch.message_count", len(recs)),
		))
	defer span.End()
	b := &Batch{Key: w.key, Token: w.token, Records: recs}
	start := time.Now()
	err := w.r.c.sink.Apply(ctx, w.key, w.token, recs[0].Offset, last.Offset, func(ctx context.Context, tx Tx) error {
		return w.handler.Handle(ctx, tx, b)
	})
	outcome := outcomeOf(err)
	w.r.c.m.applyLatency.Record(w.ctx, time.Since(start).Seconds(), withOutcome(w.id, outcome))
	span.SetAttributes(attribute.String("baton.outcome", outcome))
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		return err
	}
	w.r.c.m.applied.Add(w.ctx, int64(len(recs)), partAttrs(w.id))
	w.advanced(last)
	return nil
}

func outcomeOf(err error) string {
	switch {
	case err == nil:
		return "applied"
	case errors.Is(err, fence.ErrDuplicate):
		return "duplicate"
	case errors.Is(err, fence.ErrStale):
		return "stale"
	case IsPermanent(err):
		return "permanent"
	}
	return "error"
}

// advanced records that the sink holds everything up to r, and marks the Kafka offset for
// the next commit (for lag and tooling only; resuming trusts the sink).
func (w *worker[Tx]) advanced(r *kgo.Record) {
	w.position = r.Offset
	w.r.client().MarkCommitOffsets(map[string]map[int32]kgo.EpochOffset{
		w.id.Topic: {w.id.Partition: {Epoch: r.LeaderEpoch, Offset: r.Offset + 1}},
	})
}

func (w *worker[Tx]) refused(err error) {
	var se *fence.StaleError
	errors.As(err, &se)
	args := append(w.log(), "err", err)
	if se != nil {
		args = append(args, "presented", se.Presented.String(), "stored", se.Stored.String())
	}
	w.r.c.m.stale.Add(w.ctx, 1, partAttrs(w.id))
	w.r.c.log.Warn("fence refused this member's write: another owner took the partition; stopping it", args...)
}

// poison handles a permanent failure of recs: apply what precedes the poison record,
// dead-letter it, go on with what follows. Without a named record, one record at a time.
func (w *worker[Tx]) poison(recs []*kgo.Record, cause error) bool {
	var re *partition.RecordError
	if errors.As(cause, &re) && re.ID == w.id {
		for i, r := range recs {
			if r.Offset != re.Offset {
				continue
			}
			if i > 0 && !w.apply(recs[:i]) {
				return false
			}
			if !w.deadLetter(r, cause) {
				return false
			}
			return i+1 == len(recs) || w.apply(recs[i+1:])
		}
	}
	if len(recs) == 1 {
		return w.deadLetter(recs[0], cause)
	}
	for _, r := range recs {
		if !w.apply([]*kgo.Record{r}) {
			return false
		}
	}
	return true
}

// Headers set on dead-lettered records, next to the record's own headers.
const (
	HeaderDLQReason    = "baton.dlq.reason"
	HeaderDLQGroup     = "baton.dlq.group"
	HeaderDLQTopic     = "baton.dlq.topic"
	HeaderDLQPartition = "baton.dlq.partition"
	HeaderDLQOffset    = "baton.dlq.offset"
	HeaderDLQToken     = "baton.dlq.token"
)

// deadLetter advances the fence over r in a fenced transaction that produces r to the
// dead-letter topic before committing: a zombie's check fails before it can produce, and a
// failed commit after the produce may duplicate the dead-letter record (at least once).
func (w *worker[Tx]) deadLetter(r *kgo.Record, cause error) bool {
	topic := w.r.c.cfg.deadLetterTopic
	if topic == "" {
		topic = r.Topic + ".dlq"
	}
	err := w.attempt("dead-letter", func() error {
		return w.r.c.sink.Apply(w.ctx, w.key, w.token, r.Offset, r.Offset, func(ctx context.Context, _ Tx) error {
			d := &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Timestamp: r.Timestamp,
				Headers: append(append([]kgo.RecordHeader(nil), r.Headers...),
					kgo.RecordHeader{Key: HeaderDLQReason, Value: []byte(cause.Error())},
					kgo.RecordHeader{Key: HeaderDLQGroup, Value: []byte(w.key.Group)},
					kgo.RecordHeader{Key: HeaderDLQTopic, Value: []byte(r.Topic)},
					kgo.RecordHeader{Key: HeaderDLQPartition, Value: []byte(strconv.Itoa(int(r.Partition)))},
					kgo.RecordHeader{Key: HeaderDLQOffset, Value: []byte(itoa(r.Offset))},
					kgo.RecordHeader{Key: HeaderDLQToken, Value: []byte(w.token.String())},
				)}
			// A produce failure is transient here, whatever its cause: the record must not
			// be skipped until it is safely dead-lettered.
			if err := w.r.client().ProduceSync(ctx, d).FirstErr(); err != nil {
				return fmt.Errorf("consumer: produce to dead-letter topic %s: %w", topic, err)
			}
			return nil
		})
	})
	switch {
	case err == nil:
		w.r.c.m.deadLettered.Add(w.ctx, 1, partAttrs(w.id))
		w.r.c.log.Warn("poison record dead-lettered", append(w.log(), "offset", r.Offset, "dlq", topic, "reason", cause)...)
		w.advanced(r)
		return true
	case errors.Is(err, fence.ErrDuplicate):
		w.advanced(r)
		return true
	case errors.Is(err, fence.ErrStale):
		w.refused(err)
	}
	return false
}

// attempt runs once until it succeeds or fails with an error that retrying cannot change
// (duplicate, stale, permanent) or the worker is cancelled; other errors are transient and
// retried with bounded exponential backoff, the same work again.
func (w *worker[Tx]) attempt(what string, once func() error) error {
	backoff := w.r.c.cfg.retryMin
	for n := 1; ; n++ {
		err := once()
		if err == nil || errors.Is(err, fence.ErrDuplicate) || errors.Is(err, fence.ErrStale) ||
			IsPermanent(err) || w.ctx.Err() != nil {
			return err
		}
		w.r.c.m.retries.Add(w.ctx, 1, withOutcome(w.id, what))
		w.r.c.log.Warn("transient failure; partition stalled, retrying", append(w.log(), "op", what, "attempt", n, "backoff", backoff, "err", err)...)
		t := time.NewTimer(backoff)
		select {
		case <-w.ctx.Done():
			t.Stop()
			return w.ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, w.r.c.cfg.retryMax)
	}
}

// claim raises the fence to this member's token before the first record: era from the sink,
// epoch from the assignment. A stale claim is checked with the coordinator: if this member
// is nevertheless current the epoch source went backwards (a regression), recovered through
// Sink.Recover when RecoverRegressions is on.
//
// A stored token EQUAL to ours that this worker did not write is suspect too: within one
// incarnation of a group each generation assigns a partition to one member, so an equal
// token from someone else means the group was recreated and its generation counter came
// back to exactly the stored value (or a static member restarted without a rebalance).
// Accepting it would let a zombie of the old incarnation, holding the same token, write
// beside us; it takes the verify-and-recover path instead, which moves us to a new era.
func (w *worker[Tx]) claim() bool {
	var ours fence.Token // the token this worker last tried to claim or recovered to
	for {
		var stale *fence.StaleError
		err := w.attempt("claim", func() error {
			st, err := w.r.c.sink.Load(w.ctx, w.key)
			if err != nil {
				return err
			}
			tok := fence.Token{Era: st.Token.Era, Epoch: w.epoch}
			if st.Token == tok && tok != ours {
				return &fence.StaleError{Key: w.key, Stored: st.Token, Presented: tok}
			}
			ours = tok
			got, err := w.r.c.sink.Claim(w.ctx, w.key, tok, w.claimant)
			if err != nil {
				return err
			}
			w.token, w.position = tok, got.Position
			return nil
		})
		switch {
		case err == nil:
			w.r.c.m.claims.Add(w.ctx, 1, partAttrs(w.id))
			w.r.c.log.Debug("partition claimed", append(w.log(), "token", w.token.String(), "position", w.position)...)
			return true
		case !errors.As(err, &stale):
			return false // cancelled
		}
		w.r.c.m.staleClaims.Add(w.ctx, 1, partAttrs(w.id))
		var current bool
		if err := w.attempt("verify", func() (err error) {
			current, err = w.r.c.cfg.epochs.VerifyCurrent(w.ctx, w.r.client(), w.epoch)
			return err
		}); err != nil {
			return false
		}
		if !current {
			w.r.c.m.stale.Add(w.ctx, 1, partAttrs(w.id))
			w.r.c.log.Warn("claim refused and the coordinator says this member is no longer current: partition left unprocessed",
				append(w.log(), "presented", stale.Presented.String(), "stored", stale.Stored.String())...)
			return false
		}
		reg := &fence.RegressionError{Key: w.key, Stored: stale.Stored, Presented: stale.Presented}
		w.r.c.m.regressions.Add(w.ctx, 1, partAttrs(w.id))
		w.r.c.log.Error("epoch regression: the coordinator confirms this member is the current owner, yet the sink stores a higher token",
			append(w.log(), "err", reg, "presented", reg.Presented.String(), "stored", reg.Stored.String(), "recover", w.r.c.cfg.recoverRegressions)...)
		if !w.r.c.cfg.recoverRegressions {
			w.r.c.log.Error("RecoverRegressions is off: partition left unprocessed until an operator recovers the fence", append(w.log(), "err", reg)...)
			return false
		}
		reason := fmt.Sprintf("consumer group %s generation went back to %d, not above stored %s; member verified current with the coordinator", w.key.Group, w.epoch, stale.Stored)
		var to fence.Token
		err = w.attempt("recover", func() (err error) {
			to, err = w.r.c.sink.Recover(w.ctx, w.key, stale.Stored, w.epoch, w.claimant, reason)
			return err
		})
		switch {
		case err == nil:
			ours = to
			w.r.c.m.recoveries.Add(w.ctx, 1, partAttrs(w.id))
			w.r.c.log.Warn("epoch regression recovered", append(w.log(), "from", stale.Stored.String(), "to", to.String())...)
		case errors.Is(err, fence.ErrConflict):
			// The stored token moved meanwhile: load and claim again from scratch.
		default:
			return false
		}
	}
}

// newClaimant returns a claimant id unique to one partition worker incarnation: the member id
// (coordinator-generated per join) and 64 random bits, never reused across restarts.
func newClaimant(member string) string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	if member == "" {
		member = "member"
	}
	return member + "/" + hex.EncodeToString(b[:])
}
