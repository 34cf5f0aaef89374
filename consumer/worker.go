package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/claimant"
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
	claimant string // this worker incarnation's identity at the sink (internal/claimant): member identity + "/" + random

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
	expired   bool // stopped by the watchdog (the session expired)
	// from is the offset of the first record dispatched to this worker (or, for a worker
	// the watchdog revived, to its predecessors), -1 before any: the client's fetch cursor
	// has passed it, so a revived worker whose sink holds no position must seek back to it.
	from    int64
	revived bool // started by the watchdog's revive or retryRefused, on its predecessor's fetch cursor
	// seekedAt is run.seeks after this worker's last seek; checkSeek: no batch was handed to
	// it since (dispatch checks that one).
	seekedAt  int64
	checkSeek bool
	// stopping: a revoke, a loss, a reassignment or Run's end picked this worker to stop
	// (set under run.mu), so the watchdog's revive must not replace it with a successor.
	stopping bool
	// retry: the claim decision gave up (the coordinator refused this member the partition,
	// or the fence kept moving under its claims) after a proof begun in group session
	// refusedAt (run.sessions). A later session that still assigns the partition to this
	// member restarts it (run.retryRefused): franz-go may keep a partition assigned across
	// the sessions in between without revoking it.
	retry     bool
	refusedAt int64

	paused   atomic.Bool  // pause != 0, readable without run.mu
	inflight atomic.Int64 // records handed to this worker and not yet done

	// Set by the poller with each fetch of this partition: the topic ID the records came
	// from and the log start offset the broker reported.
	fetchedID atomic.Pointer[[16]byte]
	logStart  atomic.Int64
	topicID   atomic.Pointer[[16]byte] // the topic ID the last claim compared
	seenParts atomic.Int32             // the partition count the last claim compared
	recheck   atomic.Bool              // the topic changed since: compare again before the next batch

	// For the lag gauge (lag.go), read by its callback: the sink's position as this worker
	// last knew it (unknownPosition before its claim, or an estimate from the group's
	// committed offset), and the partition's high watermark (-1 before any).
	applied atomic.Int64
	hwm     atomic.Int64

	// Owned by the goroutine.
	token    fence.Token // the claimed token every write carries
	tried    fence.Token // the token of the last claim or write attempt (for reports)
	position int64
	sought   int64 // the offset the claim moved fetching to (claimResolved, under run.mu), -1 if it did not
	handler  Handler[Tx]
	cs       claimState        // the claim decision's memory
	judgedAt int64             // the group session (run.sessions) in which the last proof began
	prepared map[int64]any     // with Lanes: the prepared results of the records being applied, by offset
	held     *fence.TopicError // why the topic is held (opHold)
	holding  bool              // a hold was reported since the last claim that proceeded
	moveWait time.Duration     // the next wait for a move to be published (awaitMove); 0 after a claim that proceeded
}

func newWorker[Tx any](r *run[Tx], id partition.ID, epoch int64) *worker[Tx] {
	ctx, cancel := context.WithCancel(r.ctx)
	member, _ := r.client().GroupMetadata()
	identity := memberIdentity(r.client())
	w := &worker[Tx]{
		r: r, id: id, epoch: epoch, claimant: claimant.New(identity, member),
		key:    id.Key(r.c.group),
		ctx:    ctx,
		cancel: cancel,
		// Backpressure pauses the partition at maxInflightPart records, so this many
		// batches (each at least one record) plus one fetch's worth never block the poller.
		in:       make(chan []*kgo.Record, r.c.cfg.maxInflightPart+16),
		done:     make(chan struct{}),
		claimed:  make(chan struct{}),
		position: fence.NoPosition,
		sought:   -1,
		from:     -1,
		cs:       claimState{Epoch: epoch, Recover: r.c.cfg.recoverRegressions, Identity: identity},
	}
	w.applied.Store(unknownPosition)
	w.hwm.Store(-1)
	return w
}

func (w *worker[Tx]) log() []any {
	return []any{"topic", w.id.Topic, "partition", w.id.Partition}
}

func (w *worker[Tx]) run() {
	defer w.r.wg.Done()
	defer close(w.done)
	ok := w.settle(claimInput{Event: evStart})
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
	if w.r.c.cfg.prepare != nil {
		w.laneLoop() // lanes.go
	} else {
		w.loop()
	}
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
		if !w.afterCommit() { // work left by an earlier owner (e.g. outbox rows not yet relayed)
			return
		}
	}
	for {
		var recs []*kgo.Record
		select {
		case <-w.ctx.Done():
			return
		case <-idle:
			if !w.afterCommit() {
				return
			}
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
			if w.ctx.Err() != nil { // revoked, lost or expired: no batch starts after that
				w.r.done(w, int64(n))
				return
			}
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
		if w.r.c.cfg.afterCommit != nil && !w.afterCommit() {
			return
		}
	}
}

// afterCommit runs the AfterCommit hook in the partition's goroutine, under its token.
//
// A hook refused as stale under this partition's own fence (the relay's read or mark after
// another claim took the fence: a zombie of an old group incarnation, say) re-runs the claim
// decision at once, as a refused write does: an owner with nothing left to apply would
// otherwise notice only at its next record, and its outbox rows would wait until then. It
// returns false when the partition stops.
func (w *worker[Tx]) afterCommit() bool {
	if w.ctx.Err() != nil {
		return false
	}
	if w.recheck.Swap(false) {
		// The topic grew or changed since this claim compared it (watchTopics) and no record
		// came for process to compare it again: an idle partition must not run its hook past
		// a growth either. A standalone relay's shard (outboxconsumer) is always idle (its
		// coordination topic receives no records), so without this its relay would go on
		// after the shard count changed, and entities moved between shards would be relayed
		// by two shards at once. Compare again: a grown topic holds.
		w.r.c.log.Warn("the topic changed since this partition's claim: comparing it again before the after-commit hook", w.log()...)
		if !w.resettle(claimInput{Event: evStart}) {
			return false
		}
	}
	err := w.r.c.cfg.afterCommit(w.ctx, w.key, w.token)
	if err == nil || w.ctx.Err() != nil {
		return w.ctx.Err() == nil
	}
	var se *fence.StaleError
	if errors.As(err, &se) && se.Key == w.key && se.Presented == w.token {
		w.refused(err)
		return w.resettle(claimInput{Event: evWriteStale, Stored: se.Stored})
	}
	w.r.c.m.retries.Add(w.ctx, 1, w.r.c.m.outcome(w.id, "after-commit"))
	w.r.c.log.Warn("after-commit hook failed; retried after the next commit or idle interval", append(w.log(), "err", err)...)
	return true
}

// process applies recs, skipping those the sink already holds. It returns false when the
// partition must stop (not the owner any more, or cancelled by a revoke).
func (w *worker[Tx]) process(recs []*kgo.Record) bool {
	if !w.compareIfMoved() {
		return false
	}
	fresh := w.fresh(recs)
	if d := len(recs) - len(fresh); d > 0 {
		w.r.c.m.duplicates.Add(w.ctx, int64(d), w.r.c.m.part(w.id))
	}
	if len(fresh) == 0 {
		return true
	}
	w.lost(fresh[0].Offset)
	return w.apply(fresh)
}

// compareIfMoved compares the topic again before a write when it changed since the claim
// compared it (watchTopics saw it grow or get another ID, or the last fetch came from another
// topic ID): a grown or recreated topic holds here. It returns false when the partition must
// stop. process calls it before every batch, and deadLetter before a poison record the lanes
// hand it directly (a record of a held topic is dead-lettered no more than it is applied).
func (w *worker[Tx]) compareIfMoved() bool {
	if w.recheck.Swap(false) {
		// The topic grew or changed since this claim compared it (watchTopics): compare
		// again (an idempotent re-claim) before applying anything more.
		w.r.c.log.Warn("the topic changed since this partition's claim: comparing it again", w.log()...)
		if !w.resettle(claimInput{Event: evStart}) {
			return false
		}
	}
	if w.batchTopicMoved() {
		// The records come from another incarnation of the topic than the one this claim
		// compared: compare again (the fresh metadata holds the partition if the stored
		// identity is another), and apply them only if they are the claim's topic after all.
		w.r.c.log.Warn("fetched records of another topic ID than the claim's: comparing the topic again", w.log()...)
		if !w.resettle(claimInput{Event: evStart}) {
			return false
		}
		if w.batchTopicMoved() {
			return w.stuck("topic", fmt.Errorf("consumer: %s: records fetched from topic ID %s, the claim compared %s",
				w.key, topicIDText(*w.fetchedID.Load()), topicIDText(*w.topicID.Load())))
		}
	}
	return true
}

// fresh returns the records of recs after the position the sink holds. The seek to the sink's
// position makes them all fresh normally; this filter is what keeps a batch the seek did not
// catch (a fetch that raced the seek, a position that moved under us) from being refused.
func (w *worker[Tx]) fresh(recs []*kgo.Record) []*kgo.Record {
	out := recs[:0:0]
	for _, r := range recs {
		if r.Offset > w.position {
			out = append(out, r)
		}
	}
	return out
}

// apply applies recs in one fenced transaction, retrying transient failures, splitting the
// batch around a poison record. A refusal is never the end by itself: a batch that overlaps
// the sink's position is cut to what follows it; a stale or unclaimed token sends the worker
// back to the claim decision, and only a member the coordinator says is no longer the owner
// (or a regression it may not recover) stops the partition.
func (w *worker[Tx]) apply(recs []*kgo.Record) bool {
	for {
		last := recs[len(recs)-1]
		err := w.attempt("apply", func() error { return w.applyOnce(recs) })
		var se *fence.StaleError
		v := sinkVerdict(err) // the sink's own verdict, never one inside the handler's error
		switch {
		case err == nil:
			return true
		case errors.Is(v, fence.ErrDuplicate):
			// Already applied (a retried commit that had succeeded): skip it.
			w.r.c.m.duplicates.Add(w.ctx, int64(len(recs)), w.r.c.m.part(w.id))
			w.advanced(last)
			return true
		case errors.Is(v, fence.ErrOverlap):
			// Part of the batch was applied: reload the position, apply the rest.
			if !w.reload() {
				return false
			}
		case sinkMoved(err):
			// Refused by a fence retired for a move to another database: not a regression to
			// prove and recover, and not ours to retry. Claim afresh once the move is
			// published: the sink routes the claim to the partition's new database.
			if !w.awaitMove("apply", err) || !w.resettle(claimInput{Event: evStart}) {
				return false
			}
		case errors.As(v, &se):
			w.refused(err)
			if !w.resettle(claimInput{Event: evWriteStale, Stored: se.Stored}) {
				return false
			}
		case errors.Is(v, fence.ErrNotClaimed):
			if !w.resettle(claimInput{Event: evStart}) {
				return false
			}
		case IsPermanent(err) && w.ctx.Err() == nil:
			return w.poison(recs, err)
		case v != nil && w.ctx.Err() == nil:
			// ErrInvalid (a token of a later era than the stored one: the fence row was
			// deleted or restored from a backup after a recovery) or ErrConflict: never
			// silently kept, never retried blindly.
			return w.stuck("apply", err)
		default:
			// Cancelled (revoked or lost): attempt returns nothing else.
			return false
		}
		fresh := w.fresh(recs)
		if d := len(recs) - len(fresh); d > 0 {
			w.r.c.m.duplicates.Add(w.ctx, int64(d), w.r.c.m.part(w.id))
		}
		if len(fresh) == 0 {
			w.advanced(last)
			return true
		}
		recs = fresh
	}
}

// reload reads the sink's position after an overlap refusal.
func (w *worker[Tx]) reload() bool {
	var st fence.State
	err := w.attempt("load", func() (err error) {
		st, err = w.r.c.sink.Load(w.ctx, w.key)
		return err
	})
	if err != nil {
		return false
	}
	w.r.c.log.Warn("batch overlaps the sink's position; applying only what follows it",
		append(w.log(), "position", w.position, "stored", st.Position)...)
	if st.Position == w.position && !w.sleep(w.r.c.cfg.retryMin) { // no progress: do not spin
		return false
	}
	w.setPosition(st.Position)
	return true
}

// resettle runs the claim decision again after a write was refused and, if the token changed,
// rebuilds the handler for the new token.
func (w *worker[Tx]) resettle(in claimInput) bool {
	old := w.token
	if !w.settle(in) {
		return false
	}
	if w.token == old {
		return true
	}
	h, err := w.r.c.factory(w.ctx, w.key, w.token)
	if err != nil {
		if w.ctx.Err() == nil {
			w.r.c.log.Error("handler factory failed; stopping", append(w.log(), "err", err)...)
			w.r.fail(fmt.Errorf("consumer: factory for %s: %w", w.key, err))
		}
		return false
	}
	w.handler = h
	return true
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
	tok := w.token
	w.tried = tok
	b := &Batch{Key: w.key, Token: tok, Records: recs}
	if w.prepared != nil {
		b.Prepared = make([]any, len(recs))
		for i, r := range recs {
			b.Prepared[i] = w.prepared[r.Offset]
		}
	}
	start := time.Now()
	err := w.r.c.sink.Apply(ctx, w.key, tok, recs[0].Offset, last.Offset, func(ctx context.Context, tx Tx) error {
		if err := w.handler(ctx, tx, b); err != nil {
			return &handlerError{err: err}
		}
		return nil
	})
	outcome := outcomeOf(err)
	w.r.c.m.applyLatency.Record(ctx, time.Since(start).Seconds(), w.r.c.m.outcome(w.id, outcome)) // the span's context: its trace is the exemplar
	span.SetAttributes(attribute.String("baton.outcome", outcome))
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		return err
	}
	w.r.c.m.applied.Add(w.ctx, int64(len(recs)), w.r.c.m.part(w.id))
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
	case errors.Is(err, fence.ErrOverlap):
		return "overlap"
	case errors.Is(err, fence.ErrNotClaimed):
		return "not-claimed"
	case IsPermanent(err):
		return "permanent"
	}
	return "error"
}

// advanced records that the sink holds everything up to r, and marks the Kafka offset for
// commitApplied to commit (for lag and tooling only; resuming trusts the sink).
func (w *worker[Tx]) advanced(r *kgo.Record) {
	w.setPosition(r.Offset)
	w.r.client().MarkCommitOffsets(map[string]map[int32]kgo.EpochOffset{
		w.id.Topic: {w.id.Partition: {Epoch: r.LeaderEpoch, Offset: r.Offset + 1}},
	})
	select {
	case w.r.applied <- struct{}{}:
	default:
	}
}

func (w *worker[Tx]) refused(err error) {
	var se *fence.StaleError
	errors.As(err, &se)
	args := append(w.log(), "err", err)
	if se != nil {
		args = append(args, "presented", se.Presented.String(), "stored", se.Stored.String())
	}
	w.r.c.m.stale.Add(w.ctx, 1, w.r.c.m.part(w.id))
	w.r.c.log.Warn("fence refused this member's write as stale; asking the coordinator whether this member still owns the partition", args...)
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
	headerDLQReason    = "baton.dlq.reason"
	headerDLQGroup     = "baton.dlq.group"
	headerDLQTopic     = "baton.dlq.topic"
	headerDLQPartition = "baton.dlq.partition"
	headerDLQOffset    = "baton.dlq.offset"
	headerDLQToken     = "baton.dlq.token"
)

// deadLetter advances the fence over r in a fenced transaction that dead-letters r before
// committing. With [FencedDeadLetters] (outboxconsumer.DeadLetters: an
// append to the fenced outbox) the copy is written in that transaction and commits with the
// fence advance or not at all: a zombie never dead-letters. Otherwise the copy is produced to
// the dead-letter topic from inside the transaction: the fence check runs first, so a member
// whose token is already refused produces nothing, but a transaction ended under a paused
// member (idle_in_transaction_session_timeout) no longer holds the fence when the member
// resumes, so its produce may land next to its successor's copy of the same record; and a
// commit that fails after the produce duplicates it. Direct dead-lettering is at least once.
// With [AdmitDeadLetters] r is admitted first in the same transaction: refused as a copy of a
// record already applied or dead-lettered, it is dropped (no copy, the fence advanced over it).
func (w *worker[Tx]) deadLetter(r *kgo.Record, cause error) bool {
	if !w.compareIfMoved() {
		return false
	}
	topic := w.r.c.cfg.deadLetterTopic
	if topic == "" {
		topic = r.Topic + ".dlq"
	}
	for {
		if r.Offset <= w.position {
			return true // applied meanwhile (by the owner we yielded to, or before a recovery)
		}
		dl, viaTx := w.r.c.dlq, w.r.c.dlq != nil
		d := deadLetterRecord(topic, r, cause, w.key, w.token)
		produce := func(ctx context.Context) error {
			// A produce failure is transient here, whatever its cause: the record must not
			// be skipped until it is safely dead-lettered.
			if err := w.r.client().ProduceSync(ctx, d).FirstErr(); err != nil {
				return fmt.Errorf("consumer: produce to dead-letter topic %s: %w", topic, err)
			}
			return nil
		}
		w.tried = w.token
		b := &Batch{Key: w.key, Token: w.token, Records: []*kgo.Record{r}}
		if w.prepared != nil { // with Lanes: r's result, nil if its Prepare failed for good
			b.Prepared = []any{w.prepared[r.Offset]}
		}
		// Not Admitted: r is a copy of a record already applied or dead-lettered (Duplicate)
		// or a deposed producer's (Stale), as AdmitDeadLetters judged it; 0 without it.
		var refusedAs fence.Verdict
		err := w.attempt("dead-letter", func() error {
			refusedAs = 0
			return w.r.c.sink.Apply(w.ctx, w.key, w.token, r.Offset, r.Offset, func(ctx context.Context, tx Tx) error {
				if admit := w.r.c.admitDL; admit != nil {
					// The admission commits with the dead letter: a copy of r read later (a
					// relay's re-publish) is a duplicate, neither applied nor dead-lettered again.
					v, err := admit(ctx, tx, r)
					if err != nil {
						return &handlerError{err: err} // never read as the sink's verdict
					}
					switch v {
					case fence.Admitted:
					case fence.Duplicate, fence.Stale:
						refusedAs = v
						return nil // the fence advances over r; no copy
					default:
						return &handlerError{err: fmt.Errorf("consumer: AdmitDeadLetters returned %v, not a verdict", v)}
					}
				}
				if viaTx {
					if err := dl(ctx, tx, b, d); err != nil {
						return &handlerError{err: err} // never read as the sink's verdict
					}
					return nil
				}
				// A transaction that defers the fence statement to its first flush sends it
				// now: the dead letter is produced only once the fence admitted it.
				if f, ok := any(tx).(interface{ Flush(context.Context) error }); ok {
					if err := f.Flush(ctx); err != nil {
						return err
					}
				}
				return produce(ctx)
			})
		})
		var se *fence.StaleError
		// The sink's own verdict only: a FencedDeadLetters function's error (a handlerError) wrapping a
		// fence sentinel is the handler's, and read as ErrDuplicate it would skip X with no
		// dead letter (TestDeadLetterErrorWrappingAFenceSentinelIsNotAVerdict).
		v := sinkVerdict(err)
		switch {
		case err == nil && refusedAs == fence.Duplicate:
			w.r.c.m.duplicates.Add(w.ctx, 1, w.r.c.m.part(w.id))
			w.r.c.log.Warn("poison record is a copy of one already applied or dead-lettered: dropped", append(w.log(), "offset", r.Offset, "reason", cause)...)
			w.advanced(r)
			return true
		case err == nil && refusedAs == fence.Stale:
			w.r.c.log.Warn("poison record is a deposed producer's, refused by the admission: dropped", append(w.log(), "offset", r.Offset, "reason", cause)...)
			w.advanced(r)
			return true
		case err == nil:
			w.r.c.m.deadLettered.Add(w.ctx, 1, w.r.c.m.part(w.id))
			w.r.c.log.Warn("poison record dead-lettered", append(w.log(), "offset", r.Offset, "dlq", topic, "in_tx", viaTx, "reason", cause)...)
			w.advanced(r)
			return true
		case errors.Is(v, fence.ErrDuplicate):
			w.advanced(r)
			return true
		case errors.As(v, &se):
			w.refused(err)
			if !w.resettle(claimInput{Event: evWriteStale, Stored: se.Stored}) {
				return false
			}
		case errors.Is(v, fence.ErrNotClaimed):
			if !w.resettle(claimInput{Event: evStart}) {
				return false
			}
		case v != nil && w.ctx.Err() == nil:
			return w.stuck("dead-letter", err) // ErrInvalid (a later era than the stored one): loudly
		case IsPermanent(err) && w.ctx.Err() == nil:
			// The handler's store can never take this copy (too large for its outbox, say):
			// stop loudly rather than skip the record or retry for ever.
			w.r.c.log.Error("the handler refused the dead-letter copy for good; partition left unprocessed",
				append(w.log(), "offset", r.Offset, "dlq", topic, "err", err)...)
			return false
		default:
			return false // cancelled (revoked or lost)
		}
	}
}

// attempt runs once until it succeeds or fails with an error that retrying cannot change
// (duplicate, overlap, stale, not claimed, conflict, invalid, permanent, moved) or the worker is
// cancelled; other errors are transient and
// retried with bounded exponential backoff, the same work again.
//
// Retries are logged at WARN, at ERROR once the step has been failing for stalledAfter (30s).
// A single call of once that has not returned after stalledAfter is logged at ERROR too, once
// (a handler or a database call waiting for good, on a lock or on a connection pool its own
// transaction holds, would otherwise stall the partition without a word).
// In the claim steps (load, claim, recover), errors that say this member cannot use the sink
// (unusable) for longer than unusableAfter, with nothing else in between, end the Run
// (run.fail): the member leaves the group and its partitions move to one that can claim them.
func (w *worker[Tx]) attempt(what string, once func() error) error {
	backoff := w.r.c.cfg.retryMin
	var unusableSince time.Time // the start of a run of unusable errors in a claim step
	start := time.Now()
	for n := 1; ; n++ {
		slow := w.slowCall(what, n)
		err := once()
		slow.Stop()
		if err == nil || sinkVerdict(err) != nil || IsPermanent(err) || sinkMoved(err) || w.ctx.Err() != nil {
			return err
		}
		args := append(w.log(), "op", what, "attempt", n, "backoff", backoff, "err", err)
		if tableMissing(err) {
			args = append(args, "hint", migrateHint)
		}
		switch {
		case what != "load" && what != "claim" && what != "recover", !unusable(err):
			unusableSince = time.Time{}
		case unusableSince.IsZero():
			unusableSince = time.Now()
		case time.Since(unusableSince) >= w.r.c.cfg.unusableAfter:
			cause := fmt.Errorf("%w: %s %s failed for %v: %w", errSinkUnusable, what, w.key,
				time.Since(unusableSince).Round(time.Millisecond), err)
			if tableMissing(err) {
				cause = fmt.Errorf("%w (%s)", cause, migrateHint)
			}
			w.r.c.log.Error("this member cannot use the sink: leaving the group so that another member claims its partitions",
				append(args, "for", w.r.c.cfg.unusableAfter)...)
			w.r.fail(cause)
			return cause
		}
		w.r.c.m.retries.Add(w.ctx, 1, w.r.c.m.outcome(w.id, what))
		if failing := time.Since(start); failing >= w.r.c.cfg.stalledAfter {
			// An outage that lasts: at ERROR from the bound on, at every retry (at most
			// RetryBackoff's limit apart).
			w.r.c.log.Error("partition stalled: a step has kept failing for longer than the bound; retrying",
				append(args, "failing_for", failing.Round(time.Millisecond), "bound", w.r.c.cfg.stalledAfter)...)
		} else {
			w.r.c.log.Warn("transient failure; partition stalled, retrying", args...)
		}
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

// slowCall arms the timer of one call of a step: if the call has not returned after
// stalledAfter, it is logged at ERROR, once, with args. The caller stops the timer when the
// call returns.
func (w *worker[Tx]) slowCall(what string, n int, args ...any) *time.Timer {
	called := time.Now()
	return time.AfterFunc(w.r.c.cfg.stalledAfter, func() {
		w.r.c.log.Error("partition stalled: a step has not returned for longer than the bound; still waiting",
			append(append(w.log(), args...), "op", what, "attempt", n, "waiting_for", time.Since(called).Round(time.Millisecond), "bound", w.r.c.cfg.stalledAfter)...)
	})
}

// settle runs the claim decision (decideClaim) from in until it says proceed (true: w.token
// is claimed and verified, w.position is the sink's position) or give up (false: the
// partition stays unprocessed, with a WARN or ERROR and a metric), or the worker is cancelled
// (false). Every step that cannot tell (a database or coordinator error) is retried with
// backoff; none is taken as proof.
func (w *worker[Tx]) settle(in claimInput) bool {
	backoff := w.r.c.cfg.retryMin
	for {
		var step claimStep
		w.cs, step = decideClaim(w.cs, in)
		switch step.Op {
		case opLoad:
			var st fence.State
			if err := w.attempt("load", func() (err error) {
				st, err = w.r.c.sink.Load(w.ctx, w.key)
				return err
			}); err != nil {
				return w.stuck("load", err)
			}
			in = claimInput{Event: evLoaded, State: st}
		case opClaim:
			in = w.claimStep(step.Token)
			if in.Event == 0 {
				return false
			}
		case opVerify:
			var gen int64
			var ok bool
			if err := w.attempt("verify", func() (err error) {
				w.judgedAt = w.r.sessions.Load()
				gen, ok, err = w.r.c.cfg.epochs.VerifyCurrent(w.ctx, w.r.client(), w.id, step.Epoch)
				return err
			}); err != nil {
				return w.stuck("verify", err)
			}
			switch {
			case ok && gen == step.Epoch:
				in = claimInput{Event: evCurrent}
			case ok && gen > step.Epoch:
				w.r.c.log.Info("partition kept across a rebalance: claiming it at the current generation",
					append(w.log(), "assigned", step.Epoch, "generation", gen)...)
				in = claimInput{Event: evRetained, Generation: gen}
			default:
				in = claimInput{Event: evNotCurrent}
			}
		case opRecover:
			var reason string
			if step.Handover {
				// Our own identity's previous worker holds the token we present (a static
				// member replaced, a KIP-848 member rejoined in place): the new era fences it.
				// Not a regression: reported once, at INFO, when it is done.
				reason = fmt.Sprintf("consumer group %s: handover at generation %d: claimant %s replaced by %s (verified as the owner with the coordinator)",
					w.key.Group, step.Epoch, w.cs.Holder, w.claimant)
			} else {
				reg := &fence.RegressionError{Key: w.key, Stored: step.Token, Presented: w.tried}
				w.r.c.m.regressions.Add(w.ctx, 1, w.r.c.m.part(w.id))
				w.r.c.log.Error("epoch regression: the coordinator confirms this member owns the partition, yet the sink refused its token",
					append(w.log(), "err", reg, "presented", reg.Presented.String(), "stored", reg.Stored.String(), "recover", true)...)
				reason = fmt.Sprintf("consumer group %s: member verified as the owner at generation %d with the coordinator; sink held %s against its %s",
					w.key.Group, step.Epoch, step.Token, w.tried)
			}
			var to fence.Token
			err := w.attempt("recover", func() (err error) {
				to, err = w.r.c.sink.Recover(w.ctx, w.key, step.Token, step.Epoch, w.claimant, reason)
				return err
			})
			switch {
			case err == nil && step.Handover:
				w.r.c.m.handovers.Add(w.ctx, 1, w.r.c.m.part(w.id))
				w.r.c.log.Info("partition handed over at the same generation: the previous claimant of this member fenced by a new era",
					append(w.log(), "generation", step.Epoch, "previous", w.cs.Holder, "claimant", w.claimant, "from", step.Token.String(), "to", to.String())...)
				in = claimInput{Event: evRecovered, Token: to}
			case err == nil:
				w.r.c.m.recoveries.Add(w.ctx, 1, w.r.c.m.part(w.id))
				w.r.c.log.Warn("epoch regression recovered", append(w.log(), "from", step.Token.String(), "to", to.String())...)
				in = claimInput{Event: evRecovered, Token: to}
			case sinkMoved(err):
				// The stored token was read from a fence retired for a move: a compare-and-set
				// with it is not retried (it would reach the new database once the move is
				// published, against a token read from the old one). Decide afresh.
				if !w.awaitMove("recover", err) {
					return false
				}
				in = claimInput{Event: evStart}
			case errors.Is(err, fence.ErrConflict):
				w.r.c.m.retries.Add(w.ctx, 1, w.r.c.m.outcome(w.id, "recover-conflict"))
				w.r.c.log.Warn("recovery lost its compare-and-set: the stored token moved; reloading", append(w.log(), "err", err)...)
				if !w.sleep(backoff) {
					return false
				}
				backoff = min(2*backoff, w.r.c.cfg.retryMax)
				in = claimInput{Event: evConflict}
			default:
				return w.stuck("recover", err)
			}
		case opTopic:
			in = w.topicStep()
			if in.Event == 0 {
				return false
			}
		case opHold:
			if !w.hold(step.Why) {
				return false
			}
			in = claimInput{Event: evStart}
		case opProceed:
			w.moveWait = 0
			if w.holding {
				w.holding = false
				w.r.c.log.Warn("topic identity matches the fences again: partition resumed", append(w.log(), "token", w.token.String(), "position", w.position)...)
			}
			w.r.c.log.Debug("partition claimed", append(w.log(), "token", w.token.String(), "position", w.position)...)
			return true
		case opGiveUp:
			if session, again := w.r.refused(w, step.Why); again {
				// A group session began after the proof that refused us, and franz-go has
				// not revoked the partition: that session may have assigned it to this
				// member again. Decide afresh under it rather than wait for the next one.
				w.r.c.log.Info("a group session began since the coordinator refused this member the partition: claiming it again",
					append(w.log(), "refused_at", w.judgedAt, "session", session)...)
				w.judgedAt = session
				w.cs.Conflicts, w.cs.Rederived = 0, 0
				in = claimInput{Event: evStart}
				continue
			}
			w.gaveUp(step.Why)
			return false
		}
	}
}

// claimStep runs one Claim and returns its outcome as the decision's input; Event 0 means the
// worker must stop (cancelled, or an error retrying cannot change).
func (w *worker[Tx]) claimStep(tok fence.Token) claimInput {
	w.tried = tok
	var got fence.State
	err := w.attempt("claim", func() (err error) {
		got, err = w.r.c.sink.Claim(w.ctx, w.key, tok, w.claimant)
		return err
	})
	var stale *fence.StaleError
	switch {
	case err == nil:
		w.token = tok
		w.setPosition(got.Position)
		w.r.c.m.claims.Add(w.ctx, 1, w.r.c.m.part(w.id))
		return claimInput{Event: evClaimed, State: got}
	case sinkMoved(err):
		if !w.awaitMove("claim", err) {
			return claimInput{}
		}
		return claimInput{Event: evStart}
	case errors.As(err, &stale):
		w.r.c.m.staleClaims.Add(w.ctx, 1, w.r.c.m.part(w.id))
		w.r.c.log.Info("claim refused as stale; asking the coordinator whether this member owns the partition",
			append(w.log(), "err", err, "presented", tok.String(), "stored", stale.Stored.String())...)
		return claimInput{Event: evClaimStale, Stored: stale.Stored, Presented: tok}
	}
	w.stuck("claim", err)
	return claimInput{}
}

// awaitMove waits, with backoff, after the sink refused step because the partition's fence was
// retired for a move to another database (sinkMoved): the claim that follows reaches the new
// database only once the move is published. It returns false if the worker was cancelled.
// The wait is not bounded: a move interrupted before its publication leaves the partition
// refused on its old database until the move is run again.
func (w *worker[Tx]) awaitMove(step string, err error) bool {
	w.moveWait = min(max(2*w.moveWait, w.r.c.cfg.retryMin), w.r.c.cfg.retryMax)
	w.r.c.m.retries.Add(w.ctx, 1, w.r.c.m.outcome(w.id, "moved"))
	w.r.c.log.Warn("the partition is being moved to another database: waiting for the move to be published, then claiming it there",
		append(w.log(), "op", step, "wait", w.moveWait, "err", err)...)
	return w.sleep(w.moveWait)
}

// stuck reports a claim step that failed with an error retrying cannot change (the worker was
// cancelled otherwise) and returns false.
func (w *worker[Tx]) stuck(op string, err error) bool {
	if w.ctx.Err() == nil && !errors.Is(err, errSinkUnusable) { // that one attempt reported, and ends the Run
		w.r.c.m.stale.Add(w.ctx, 1, w.r.c.m.part(w.id))
		w.r.c.log.Error("claim step failed; partition left unprocessed", append(w.log(), "op", op, "err", err)...)
	}
	return false
}

// gaveUp reports why the claim decision stopped the partition.
func (w *worker[Tx]) gaveUp(why giveUp) {
	args := append(w.log(), "presented", w.tried.String(), "stored", w.cs.Stale.String(), "epoch", w.cs.Epoch)
	switch why {
	case giveUpNotCurrent:
		w.r.c.m.stale.Add(w.ctx, 1, w.r.c.m.part(w.id))
		w.r.c.log.Warn("the coordinator says this member no longer owns the partition: left unprocessed", args...)
	case giveUpNoRecovery:
		reg := &fence.RegressionError{Key: w.key, Stored: w.cs.Stale, Presented: w.tried}
		w.r.c.m.regressions.Add(w.ctx, 1, w.r.c.m.part(w.id))
		w.r.c.log.Error("epoch regression and RecoverRegressions is off: partition left unprocessed until an operator recovers the fence",
			append(args, "err", reg)...)
	case giveUpConflicts, giveUpRederived:
		w.r.c.m.stale.Add(w.ctx, 1, w.r.c.m.part(w.id))
		w.r.c.log.Warn("the partition's fence kept moving under this member's claims: left unprocessed", append(args, "conflicts", w.cs.Conflicts, "rederived", w.cs.Rederived)...)
	}
}

// sleep waits d or until the worker is cancelled.
func (w *worker[Tx]) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// sinkMoved reports whether err holds, outside any handlerError, an error whose Moved method
// reports true: a sink that routes keys to several databases (fence/shard's router) refused
// the call because the partition's fence there was retired for a move to another one. A
// handler's own such error (a router's Advance inside the handler) is never the sink's.
func sinkMoved(err error) bool {
	switch e := err.(type) {
	case nil, *handlerError:
		return false
	case interface{ Moved() bool }:
		if e.Moved() {
			return true
		}
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return sinkMoved(u.Unwrap())
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if sinkMoved(e) {
				return true
			}
		}
	}
	return false
}

// handlerError marks an error the handler returned, so that a fence sentinel it happens to
// wrap (its own idempotency layer, another key's outbox append) is never read as the sink's
// verdict on this batch: a handler error wrapping fence.ErrDuplicate must be retried, not make
// the worker skip records the sink never applied.
type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }

// sinkVerdict returns the sink's own verdict carried by err (stale, duplicate, overlap, not
// claimed, conflict, invalid): the first fence sentinel or *fence.StaleError found in err's
// tree outside any handlerError, or nil. Walking the tree, rather than errors.Is on the whole
// error, keeps a sink that joins its verdict with the handler's error (errors.Join, or two %w)
// from having its verdict hidden by the handler's, or a handler's sentinel taken for its own.
func sinkVerdict(err error) error {
	switch e := err.(type) {
	case nil, *handlerError:
		return nil
	case *fence.StaleError:
		return e
	}
	for _, s := range []error{fence.ErrDuplicate, fence.ErrStale, fence.ErrOverlap, fence.ErrNotClaimed,
		fence.ErrConflict, fence.ErrInvalid} {
		if err == s {
			return err
		}
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return sinkVerdict(u.Unwrap())
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if v := sinkVerdict(e); v != nil {
				return v
			}
		}
	}
	return nil
}
