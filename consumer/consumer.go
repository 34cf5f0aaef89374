package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/fencecheck"
	"github.com/batonhq/baton/partition"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel/trace"
)

// Handler applies a batch of one partition inside the sink's transaction. It is never called
// concurrently for the same partition.
//
// ctx is cancelled when this member loses the partition; tx belongs to the sink's fenced
// transaction and commits only if the handler returns nil and the fence still accepts the
// token. Return [Permanent] (wrapped by [Batch.Fail] to name the record) for a poison record;
// any other error is retried with backoff, the same batch again.
type Handler[Tx any] func(ctx context.Context, tx Tx, b *Batch) error

// Batch is a run of consecutive records of one partition, applied in one fenced transaction.
type Batch struct {
	Key     fence.Key   // the partition's fence key: group, topic, partition
	Token   fence.Token // the owner's token, checked by the sink at commit
	Records []*kgo.Record
	// Prepared holds, with [Lanes], what the prepare function returned for each record:
	// Prepared[i] is Records[i]'s. Nil without Lanes.
	Prepared []any
}

// Fail marks r as the poison record of the batch: the consumer applies the records before it,
// dead-letters it with err as the reason, and goes on with the records after it. Return the
// result from the handler: a *partition.RecordError naming r and wrapping Permanent(err).
func (b *Batch) Fail(r *kgo.Record, err error) *partition.RecordError {
	return &partition.RecordError{ID: partition.Of(r), Offset: r.Offset, Key: r.Key, Err: Permanent(err)}
}

// Factory builds the handler of a partition when this member is assigned it, after the
// partition's fence key k was claimed with token t (and again when the partition is claimed
// with a new token). The handler's state is owned by the partition's single goroutine: it
// needs no locks. See [PerPartition].
type Factory[Tx any] func(ctx context.Context, k fence.Key, t fence.Token) (Handler[Tx], error)

// Consumer is a single-writer consumer-group member: it owns the partitions Kafka assigns it,
// claims each in the sink, and applies their records in fenced transactions.
type Consumer[Tx any] struct {
	group   string
	topics  []string
	sink    fence.Sink[Tx]
	factory Factory[Tx]
	dlq     func(context.Context, Tx, *Batch, *kgo.Record) error          // FencedDeadLetters, or nil
	admitDL func(context.Context, Tx, *kgo.Record) (fence.Verdict, error) // AdmitDeadLetters, or nil
	cfg     config
	m       *meters
	tracer  trace.Tracer
	log     *slog.Logger
	cur     atomic.Pointer[run[Tx]] // the running Run's state, for Readiness (health.go)

	noTopics sync.Once // the WARN that the sink does not store topic identities
}

// New returns a consumer for group over topics, writing through sink, applying every
// partition's batches with handler. A handler that keeps per-partition state is built per
// partition by a factory instead: pass a nil handler and [PerPartition]. It validates
// everything and reports every problem at once (errors.Join), each naming what is wrong: an
// empty or invalid group; no topics, an empty name or one Kafka refuses (longer than 249
// characters, "." or "..", or a character outside [a-zA-Z0-9._-]); a nil sink, or a typed nil
// such as a nil *pgfence.Store; neither a handler nor PerPartition; no kgo.SeedBrokers among
// the [Kafka] options; and, matching [ErrInvalidOption], a nil or invalid option, both a
// handler and PerPartition, a PerPartition, FencedDeadLetters or AdmitDeadLetters function of another
// transaction type than the sink's, a Kafka option franz-go refuses, or one Baton owns (named).
//
// New has no side effect: it connects to nothing and starts nothing (the Kafka options are
// checked with kgo.ValidateOpts, and the reset offset read from a client closed unused);
// [Consumer.Run] does.
func New[Tx any](group string, topics []string, sink fence.Sink[Tx], handler Handler[Tx], opts ...Option) (*Consumer[Tx], error) {
	var errs []error
	// The group's rules are the fence key's: it is stored with every fence.
	if err := fencecheck.ValidateKey(fence.Key{Group: group, Topic: probeTopic}); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", errNoGroup, err))
	}
	if len(topics) == 0 {
		errs = append(errs, errNoTopics)
	}
	for _, t := range topics {
		errs = append(errs, validTopic(t))
	}
	if isNil(sink) {
		errs = append(errs, errNilSink)
	}
	cfg := defaults()
	for i, o := range opts {
		if o == nil {
			errs = append(errs, fmt.Errorf("%w: option %d is nil", ErrInvalidOption, i))
			continue
		}
		errs = append(errs, o(&cfg))
	}
	if cfg.maxInflight < cfg.maxInflightPart {
		errs = append(errs, fmt.Errorf("%w: MaxInflight %d below MaxInflightPerPartition %d", ErrInvalidOption, cfg.maxInflight, cfg.maxInflightPart))
	}
	factory, ferr := handlers(handler, cfg.factory)
	errs = append(errs, ferr)
	var dlq func(context.Context, Tx, *Batch, *kgo.Record) error
	if cfg.deadLetters != nil {
		f, ok := cfg.deadLetters.(func(context.Context, Tx, *Batch, *kgo.Record) error)
		if !ok {
			errs = append(errs, fmt.Errorf("%w: FencedDeadLetters takes %s, the sink's transactions are %s", ErrInvalidOption, txOf(cfg.deadLetters), txName[Tx]()))
		}
		dlq = f
	}
	var admitDL func(context.Context, Tx, *kgo.Record) (fence.Verdict, error)
	if cfg.admitDeadLetters != nil {
		f, ok := cfg.admitDeadLetters.(func(context.Context, Tx, *kgo.Record) (fence.Verdict, error))
		if !ok {
			errs = append(errs, fmt.Errorf("%w: AdmitDeadLetters takes %s, the sink's transactions are %s", ErrInvalidOption, txOf(cfg.admitDeadLetters), txName[Tx]()))
		}
		admitDL = f
	}
	errs = append(errs, cfg.resolveProtocol())
	errs = append(errs, checkKafka(cfg.kafka)...)
	errs = append(errs, ownedInClient(cfg.kafka))
	if err := joinAll(errs); err != nil {
		return nil, err
	}
	m, err := newMeters(cfg.meters, group)
	if err != nil {
		return nil, fmt.Errorf("%w: meters: %w", ErrInvalidOption, err)
	}
	return &Consumer[Tx]{
		group: group, topics: append([]string(nil), topics...), sink: sink, factory: factory, dlq: dlq, admitDL: admitDL,
		cfg: cfg, m: m, tracer: cfg.tracers.Tracer(instrumentation), log: cfg.logger.With("group", group),
	}, nil
}

// Run joins the group and processes the partitions assigned to this member until ctx is
// cancelled; then it lets every in-flight batch finish or roll back, commits the applied
// offsets, leaves the group and returns nil. No goroutine it starts outlives it.
//
// It returns an error if the Kafka client cannot be created, the Kafka options hold
// kgo.ServerSideBalancer (or franz-go's
// KIP-848 opt-in in the kgo.WithContext context) with the classic protocol
// ([ErrInvalidOption]: use [GroupProtocol]), a partition's [PerPartition] factory fails, or ctx
// ended before this member ever joined the group ([ErrNotJoined], with the last cause: the
// cluster unreachable, authentication failed, the group not joinable). While the client
// cannot connect or join, the cause is logged at ERROR (at most every 10s while it lasts) and
// counted (baton.consumer.client_errors); Run keeps trying until ctx ends.
//
// It also returns an error, after leaving the group, when this member cannot use its sink: a
// partition's claim (loading, claiming or recovering its fence) failed for 30s with nothing
// but errors that no retry fixes: a SQLSTATE of class 28 (a wrong password, a role that may not
// log in), 3D000, 3F000 (no such database or schema), 42P01 (no such table: run baton
// migrate) or 42501 (a missing or revoked grant). The error names the partition and wraps the
// sink's (errors.As finds the *pgconn.PgError), so the member's partitions move to one that
// can claim them instead of waiting behind this one (a static member, kgo.InstanceID, whose
// closing client does not leave, is removed by its instance id); restarting the process
// without fixing the cause repeats it. An outage (a refused connection, a database starting or
// shutting down, any error without such a SQLSTATE) never ends Run: the partitions wait and
// retry. Only errors carrying a SQLSTATE count (pgfence's, or a sink's wrapping lib/pq's):
// sqlitefence's and redisfence's carry none, so a member on those retries a missing table, a
// read-only file, or Redis's NOAUTH, WRONGPASS or NOPERM for as long as it runs.
func (c *Consumer[Tx]) Run(ctx context.Context) error {
	if err := protocolAtRun(c.cfg.kafka, c.cfg.protocol); err != nil {
		return err
	}
	r := &run[Tx]{c: c, workers: map[partition.ID]*worker[Tx]{}, space: make(chan struct{}, 1), fatal: make(chan error, 1),
		applied: make(chan struct{}, 1),
		health:  &health{log: c.log, errs: c.m.clientErrors, attrs: c.m.kind}, wd: newWatchdog()}
	r.ctx, r.cancel = context.WithCancel(context.WithoutCancel(ctx))
	defer r.cancel()
	r.pollCtx, r.wake = context.WithCancel(ctx)
	defer r.wake()
	c.cur.Store(r)
	defer c.cur.CompareAndSwap(r, nil)

	wd := r.wd
	opts := append(kafkaDefaults(), c.cfg.kafka...)
	opts = append(opts,
		kgo.ConsumerGroup(c.group),
		kgo.ConsumeTopics(c.topics...),
		kgo.AutoCommitMarks(),
		kgo.OnPartitionsAssigned(r.assigned),
		kgo.OnPartitionsRevoked(r.revoked),
		kgo.OnPartitionsLost(r.lost),
		kgo.WithHooks(r.health, wd),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("consumer: kafka client: %w", err)
	}
	r.clp.CompareAndSwap(nil, cl)
	stopWatchdog := r.watchSession(cl, wd)
	r.wg.Add(3)
	go r.watchTopics()
	go r.watchLag()
	go r.commitApplied()
	c.m.zeroRun(r.ctx)
	if reg, err := c.m.meter.RegisterCallback(r.observeLag, c.m.lag); err == nil {
		defer func() { _ = reg.Unregister() }()
	} else {
		c.log.Warn("lag gauge not registered", "err", err)
	}
	err = r.poll(ctx)
	stopWatchdog()
	member, _ := cl.GroupMetadata()
	// Close leaves the group; leaving revokes every partition through r.revoked, which stops
	// the workers after their in-flight batch and commits what was applied.
	r.health.closing.Store(true)
	cl.Close()
	r.stopAll() // anything left (e.g. after a fatal error) is stopped; nothing commits it
	r.cancel()  // ends watchTopics
	r.wg.Wait()
	if err == nil {
		// A fatal error that raced the caller's cancellation, or came while the workers
		// stopped, is still the run's result: never report it as a clean shutdown.
		select {
		case err = <-r.fatal:
		default:
		}
	}
	if errors.Is(err, errSinkUnusable) {
		c.leaveStatic(cl, member)
	}
	if err == nil && !r.health.joined.Load() {
		// A run that never joined did no work: never report it as a clean one.
		return r.health.neverJoined(c.group)
	}
	return err
}

// leaveStatic ends the membership of a static member (kgo.InstanceID) whose Run gives up on
// its sink, once its client is closed and its workers have returned. Closing the client leaves
// a dynamic member's group, not a static one's: the group would keep the member's partitions
// for its session timeout, and give them back to it if it restarted within that, so they
// would never move to a member that can claim them. member is the member id it had: a restart
// that rejoined meanwhile has another, and the coordinator refuses to remove that one.
func (c *Consumer[Tx]) leaveStatic(closed *kgo.Client, member string) {
	instance, _ := closed.OptValue(kgo.InstanceID).(string)
	if instance == "" || member == "" {
		return
	}
	cl, err := kgo.NewClient(slices.Concat(c.cfg.kafka,
		[]kgo.Opt{kgo.ConsumerGroup(""), kgo.ConsumeTopics(), kgo.ConsumePartitions(nil)})...)
	if err != nil {
		c.log.Warn("static member not removed from the group: its partitions move after the session timeout", "instance", instance, "err", err)
		return
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if c.cfg.protocol == protocolConsumer {
		req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
		req.Group, req.MemberID, req.InstanceID, req.MemberEpoch = c.group, member, &instance, -1 // -1: leave for good
		var resp *kmsg.ConsumerGroupHeartbeatResponse
		if resp, err = req.RequestWith(ctx, cl); err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
	} else {
		req := kmsg.NewPtrLeaveGroupRequest()
		req.Group = c.group
		m := kmsg.NewLeaveGroupRequestMember()
		m.MemberID, m.InstanceID = member, &instance
		m.Reason = kmsg.StringPtr("baton: this member cannot use its sink")
		req.Members = append(req.Members, m)
		var resp *kmsg.LeaveGroupResponse
		if resp, err = req.RequestWith(ctx, cl); err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
			for _, m := range resp.Members {
				err = cmp.Or(err, kerr.ErrorForCode(m.ErrorCode))
			}
		}
	}
	if err != nil {
		c.log.Warn("static member not removed from the group: its partitions move after the session timeout", "instance", instance, "err", err)
		return
	}
	c.log.Info("static member removed from the group so that its partitions move now", "instance", instance, "member", member)
}

// run is the state of one Run: the Kafka client and the registry of partition workers. The
// registry (not any partition's state) is shared by the poll loop and the rebalance
// callbacks, hence mu.
type run[Tx any] struct {
	c      *Consumer[Tx]
	clp    atomic.Pointer[kgo.Client] // set by Run, or by the first callback if it runs first
	ctx    context.Context            // parent of every worker; cancelled when Run returns
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	workers map[partition.ID]*worker[Tx]

	total atomic.Int64  // records handed to live workers and not yet done
	space chan struct{} // poked when total drops
	// applied is poked after each batch's offset is marked: commitApplied commits it to Kafka.
	applied chan struct{}
	fatal   chan error
	// pollCtx is Run's ctx, also cancelled (wake) by fail so that a poll waiting for fetches
	// returns and sees the error.
	pollCtx context.Context
	wake    context.CancelFunc
	wd      *watchdog // the group session's watchdog

	health *health // client errors, and whether the member ever joined

	// sessions counts the calls of OnPartitionsAssigned, one per group session. A count, not
	// the generation: a deleted and recreated group starts its generations again from 1.
	sessions atomic.Int64
	// seeks counts the claims' seeks (claimResolved, after SetOffsets returned): a poll that
	// read a lower count before it began may hold records fetched ahead of a seek (dispatch).
	seeks atomic.Int64

	looked map[string]time.Time // topic -> the last look after an UNKNOWN_TOPIC_ID fetch (poll's goroutine only)
}

// client returns the run's Kafka client. The group can start before NewClient returns to Run,
// so callbacks publish the client they are given too.
func (r *run[Tx]) client() *kgo.Client { return r.clp.Load() }

// fail ends the Run with err (the first one, if several): poll returns it, at once even while
// it waits for a fetch.
func (r *run[Tx]) fail(err error) {
	select {
	case r.fatal <- err:
	default:
	}
	if r.wake != nil {
		r.wake()
	}
}

// poll is the fetch loop: it hands each partition's records to the partition's worker and
// applies backpressure (a global bound by not polling, a per-partition bound by pausing).
func (r *run[Tx]) poll(ctx context.Context) error {
	limit := r.c.cfg.maxInflight
	for {
		for r.total.Load() >= int64(limit) {
			select {
			case <-ctx.Done():
				return nil
			case err := <-r.fatal:
				return err
			case <-r.space:
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case err := <-r.fatal:
			return err
		default:
		}
		stamp := r.seeks.Load() // before the poll: seeks done by now are behind every record it returns
		fs := r.client().PollFetches(r.pollCtx)
		if fs.IsClientClosed() {
			return nil
		}
		// The topic ID a fetch refused with UNKNOWN_TOPIC_ID used: the client's own, which a
		// recreation leaves stale even where this member's claims already compared the new one.
		var refusedID map[string][16]byte
		fs.EachTopic(func(t kgo.FetchTopic) {
			for _, p := range t.Partitions {
				if errors.Is(p.Err, kerr.UnknownTopicID) && t.TopicID != ([16]byte{}) {
					if refusedID == nil {
						refusedID = map[string][16]byte{}
					}
					refusedID[t.Topic] = t.TopicID
				}
			}
		})
		// The records first, the errors after: an UNKNOWN_TOPIC_ID look is a request of up to
		// unknownTopicLook, and records held across it could reach a worker that a rebalance
		// or a restart started, and whose claim sought back, meanwhile: ahead
		// of the seek, they would skip what its predecessor had dropped.
		fs.EachTopic(func(t kgo.FetchTopic) {
			for _, p := range t.Partitions {
				if len(p.Records) == 0 {
					continue
				}
				id := partition.ID{Topic: t.Topic, Partition: p.Partition}
				r.dispatch(ctx, id, p.Records, t.TopicID, p.LogStartOffset, p.HighWatermark, stamp)
			}
		})
		fs.EachError(func(topic string, p int32, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			if topic == "" {
				// Not a partition's error: the client could not load metadata (e.g. SASL
				// failed); franz-go injects those into the poll.
				r.health.failed("fetch", err)
				return
			}
			if p < 0 {
				// A whole topic's metadata failed (TOPIC_AUTHORIZATION_FAILED: a missing ACL);
				// franz-go retries it every 250ms: rate-limited like the client errors, and
				// the cause Run reports if the member never joins.
				r.health.failed("topic", fmt.Errorf("topic %s: %w", topic, err))
				return
			}
			if errors.Is(err, kerr.UnknownTopicID) {
				r.unknownTopicID(ctx, topic, refusedID[topic]) // throttled; logs what it finds
				return
			}
			r.c.log.Warn("fetch error", "topic", topic, "partition", p, "err", err)
		})
	}
}

// dispatch hands recs, of a poll begun when the seek count was stamp, to the partition's
// worker. Records of a partition with no live worker (revoked between the fetch and now) are
// dropped: the next owner re-reads them from the sink's position.
func (r *run[Tx]) dispatch(ctx context.Context, k partition.ID, recs []*kgo.Record, topicID [16]byte, logStart, hwm int64, stamp int64) {
	n := int64(len(recs))
	r.mu.Lock()
	w := r.workers[k]
	if w == nil || w.removed {
		r.mu.Unlock()
		return
	}
	w.seeHWM(hwm)
	if w.checkSeek {
		// The first batch since the claim's seek. From a poll begun before the seek it may
		// have been fetched on the cursor the seek replaced (a restarted worker's predecessor's,
		// past records it dropped unapplied): applied, it would skip what lies between. A poll
		// begun after the seek returned holds only records fetched from the seek on (SetOffsets
		// stops the fetch session and discards its buffered fetches before returning), so
		// whatever gap it shows is the log's own (transaction markers, compaction). So a batch
		// of an earlier poll that does not start where the seek (or the log start) says is
		// dropped, and the seek done again: the next poll is trusted.
		if want := max(w.sought, logStart); stamp < w.seekedAt && recs[0].Offset != want {
			r.c.log.Warn("dropped a batch fetched before this partition's seek that does not start there; seeking again",
				append(w.log(), "first", recs[0].Offset, "want", want)...)
			r.seek(w, w.sought)
			r.mu.Unlock()
			return
		}
		w.checkSeek = false
	}
	if w.from < 0 {
		w.from = recs[0].Offset
	}
	if w.revived && !w.claimDone {
		// A restarted worker's partition is paused from its start until its claim resolved
		// (claimResolved seeks, then resumes it), so these records were fetched before the
		// restart, on its predecessor's cursor: they need not follow the sink's position
		// (the predecessor dropped what it had not applied), and applied after the seek they
		// would skip the records in between. Dropped; the seek reads them again (from its
		// start, noted in from, when the sink has no position). Records of a poll taken
		// before the restart that reach it only after its claim resolved are not told apart;
		// poll hands a poll's records out before anything slow to keep that window short.
		r.mu.Unlock()
		return
	}
	// Counted under mu so that removal, also under mu, accounts for everything it strands.
	if w.inflight.Add(n) >= int64(r.c.cfg.maxInflightPart) {
		r.setPause(w, pauseBackpressure, true)
	}
	r.total.Add(n)
	r.mu.Unlock()
	if topicID != ([16]byte{}) {
		w.fetchedID.Store(&topicID)
	}
	w.logStart.Store(logStart)
	select {
	case w.in <- recs:
	case <-w.done:
	case <-ctx.Done():
	}
}

// Pause reasons; fetching of a partition is paused while any is set.
const (
	pauseBackpressure = 1 << iota
	pauseClaiming
	pauseIdle
	pauseWatchdog
)

// seek moves w's fetching to offset and notes it, for dispatch to check the first batch after
// it. r.mu must be held.
func (r *run[Tx]) seek(w *worker[Tx], offset int64) {
	r.client().SetOffsets(map[string]map[int32]kgo.EpochOffset{w.id.Topic: {w.id.Partition: {Epoch: -1, Offset: offset}}})
	w.seekedAt, w.checkSeek = r.seeks.Add(1), true
}

// setPause sets or clears one pause reason of w and pauses or resumes fetching when the
// partition's state changes. r.mu must be held.
func (r *run[Tx]) setPause(w *worker[Tx], reason int, on bool) {
	was := w.pause != 0
	if on {
		w.pause |= reason
	} else {
		w.pause &^= reason
	}
	w.paused.Store(w.pause != 0)
	if w.removed {
		return
	}
	m := map[string][]int32{w.id.Topic: {w.id.Partition}}
	switch now := w.pause != 0; {
	case now && !was:
		r.client().PauseFetchPartitions(m)
	case !now && was:
		r.client().ResumeFetchPartitions(m)
	}
}

// done releases n records of w's in-flight count and resumes a partition paused by
// backpressure once half of its bound is free.
func (r *run[Tx]) done(w *worker[Tx], n int64) {
	left := w.inflight.Add(-n)
	r.total.Add(-n)
	select {
	case r.space <- struct{}{}:
	default:
	}
	if w.paused.Load() && left <= int64(r.c.cfg.maxInflightPart/2) {
		r.mu.Lock()
		if w.pause&pauseBackpressure != 0 {
			r.setPause(w, pauseBackpressure, false)
		}
		r.mu.Unlock()
	}
}

// assigned is OnPartitionsAssigned: capture the epoch of this assignment for the newly
// assigned partitions (retained ones keep their token), start one worker per partition, and
// wait for their claims so that fetching starts at the sink's position.
func (r *run[Tx]) assigned(_ context.Context, cl *kgo.Client, added map[string][]int32) {
	r.clp.CompareAndSwap(nil, cl)
	r.health.joined.Store(true) // franz-go calls this after every join and sync, even with nothing added
	// Counted before retryRefused takes run.mu: a worker that gives up (refused, under run.mu)
	// either is marked before that scan or sees this count and decides again itself.
	session := r.sessions.Add(1)
	// After the new assignments: a refused partition newly assigned again gets a new worker
	// there; the others that this session still assigns to us are restarted here.
	defer r.retryRefused(session)
	if len(added) == 0 {
		r.health.session.Store(true)
		return
	}
	// Readiness: not joined until the added partitions are registered (then they count as
	// assigned and not yet claimed).
	r.health.session.Store(false)
	epoch, err := r.c.cfg.epochs.AssignedEpoch(cl)
	if err != nil {
		r.c.log.Error("no epoch for the assignment; partitions left unprocessed", "err", err)
		r.fail(fmt.Errorf("consumer: assignment epoch: %w", err))
		return
	}
	var started []*worker[Tx]
	r.mu.Lock()
	for topic, ps := range added {
		for _, p := range ps {
			k := partition.ID{Topic: topic, Partition: p}
			if old := r.workers[k]; old != nil { // franz-go revokes before reassigning; be safe anyway
				old.stopping = true
				r.mu.Unlock()
				r.stop(old)
				r.mu.Lock()
			}
			w := newWorker(r, k, epoch)
			r.workers[k] = w
			started = append(started, w)
			r.c.m.zeroPartition(r.ctx, k, r.c.cfg.prepare != nil)
			r.c.m.rebalances.Add(r.ctx, 1, r.c.m.outcome(k, "assigned"))
		}
	}
	r.mu.Unlock()
	r.health.session.Store(true)
	for _, w := range started {
		r.wg.Add(1)
		go w.run()
	}
	r.c.log.Info("partitions assigned", "epoch", epoch, "partitions", added)

	wait, cancel := context.WithTimeout(r.ctx, r.c.cfg.claimWait)
	defer cancel()
	for _, w := range started {
		select {
		case <-w.claimed:
			continue
		case <-wait.Done():
		}
		// The claim is slow (a database down?): let the rebalance finish but keep the
		// partition paused; the worker seeks and resumes it when its claim completes.
		r.mu.Lock()
		if !w.claimDone {
			w.late = true
			r.setPause(w, pauseClaiming, true)
		}
		r.mu.Unlock()
	}
}

// refused is called by a worker whose claim decision gives up (why) after a proof begun in
// group session w.judgedAt (run.sessions). A partition the coordinator refused this member
// (or whose fence kept moving under its claims) may stay assigned to it: franz-go learns of
// the later generation only when it rejoins, and a cooperative rebalance can give the
// partition back to this member without revoking it first (found by the chaos fault
// topic-grow: two partitions left unprocessed for good by a member that kept them). So the
// worker is marked for a retry, and the next group session that still assigns the partition
// restarts it (retryRefused). If such a session began already (an OnPartitionsAssigned
// counted during the proof), refused returns it and true, and the worker decides afresh at
// once instead: at most once per session, never in a loop. A regression with
// RecoverRegressions off waits for an operator, not a session: never retried.
func (r *run[Tx]) refused(w *worker[Tx], why giveUp) (int64, bool) {
	if why != giveUpNotCurrent && why != giveUpConflicts && why != giveUpRederived {
		return 0, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := r.sessions.Load(); now > w.judgedAt {
		return now, true
	}
	w.retry, w.refusedAt = true, w.judgedAt
	return 0, false
}

// retryRefused restarts, from OnPartitionsAssigned, the workers that gave up in a session
// before this one (retry) and whose partition this session still assigns to this
// member (prerevoke stopped those it does not). Like the watchdog's revive, the new worker is
// the same claimant at the same epoch, started after the old one returned, on its fetch
// cursor: it claims, compares the topic and proves ownership with the coordinator before any
// write, exactly as at an assignment, so a member that is still not the owner gives up again
// and writes nothing.
func (r *run[Tx]) retryRefused(session int64) {
	r.mu.Lock()
	var olds []*worker[Tx]
	for _, w := range r.workers {
		if w.retry && w.refusedAt < session && !w.removed && !w.stopping && !w.expired {
			w.stopping = true // ours to replace: the watchdog's revive must not
			olds = append(olds, w)
		}
	}
	r.mu.Unlock()
	var started []*worker[Tx]
	for _, old := range olds {
		old.cancel()
		<-old.done
		r.mu.Lock()
		if old.removed || r.workers[old.id] != old {
			r.mu.Unlock()
			continue
		}
		w := r.successor(old)
		started = append(started, w)
		r.c.log.Info("partition still assigned to this member in a later group session after the coordinator refused it: claiming it again",
			append(w.log(), "refused_at", old.refusedAt, "session", session)...)
		r.mu.Unlock()
	}
	for _, w := range started {
		r.wg.Add(1)
		go w.run()
	}
}

// revoked is OnPartitionsRevoked: the rebalance barrier. Each revoked partition's worker is
// cancelled and waited for (its in-flight batch commits or rolls back), then the offsets of
// applied batches are committed.
func (r *run[Tx]) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	r.clp.CompareAndSwap(nil, cl)
	r.stopPartitions(revoked, "revoked")
	if err := cl.CommitMarkedOffsets(ctx); err != nil {
		r.c.log.Warn("commit offsets on revoke", "err", err)
	}
}

// lost is OnPartitionsLost: like revoked, without a commit (it would fail, and the sink's
// position is authoritative anyway).
func (r *run[Tx]) lost(_ context.Context, cl *kgo.Client, lost map[string][]int32) {
	r.clp.CompareAndSwap(nil, cl)
	r.health.session.Store(false) // not joined again until the next assignment
	r.stopPartitions(lost, "lost")
}

func (r *run[Tx]) stopPartitions(m map[string][]int32, why string) {
	var ws []*worker[Tx]
	r.mu.Lock()
	for topic, ps := range m {
		for _, p := range ps {
			k := partition.ID{Topic: topic, Partition: p}
			if w := r.workers[k]; w != nil {
				w.stopping = true // the watchdog's revive must not replace it (ReviveRacesRevoke)
				ws = append(ws, w)
			}
			r.c.m.rebalances.Add(r.ctx, 1, r.c.m.outcome(k, why))
		}
	}
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Add(1)
		go func() { defer wg.Done(); r.stop(w) }()
	}
	wg.Wait()
	if len(m) > 0 {
		r.c.log.Info("partitions "+why, "partitions", m)
	}
}

// stop cancels w, waits for it, and removes it from the registry, releasing what it still
// had in flight and clearing its pause so a later assignment starts fetching normally.
func (r *run[Tx]) stop(w *worker[Tx]) {
	w.cancel()
	<-w.done
	r.mu.Lock()
	defer r.mu.Unlock()
	if w.removed {
		return
	}
	if w.pause != 0 {
		r.setPause(w, pauseBackpressure|pauseClaiming|pauseIdle|pauseWatchdog, false)
	}
	w.removed = true
	if r.workers[w.id] == w {
		delete(r.workers, w.id)
	}
	r.release(w)
}

// release drops what a removed worker still had in flight from the run's count and wakes the
// poller, which may be waiting for room.
func (r *run[Tx]) release(w *worker[Tx]) {
	r.total.Add(-w.inflight.Swap(0))
	select {
	case r.space <- struct{}{}:
	default:
	}
}

func (r *run[Tx]) stopAll() {
	r.mu.Lock()
	var ws []*worker[Tx]
	for _, w := range r.workers {
		w.stopping = true
		ws = append(ws, w)
	}
	r.mu.Unlock()
	for _, w := range ws {
		r.stop(w)
	}
}

// claimResolved is called by a worker once its claim is resolved. On success it moves the
// fetch position to just after the sink's position (the sink, not Kafka's committed offset,
// is authoritative); on failure it pauses the partition, which stays unprocessed.
func (r *run[Tx]) claimResolved(w *worker[Tx], ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w.claimDone = true
	if w.removed {
		return
	}
	seek := int64(-1)
	switch {
	case ok && w.position != fence.NoPosition:
		// Inside OnPartitionsAssigned franz-go records this seek against the offset fetch
		// it is about to make and lets it win over the committed offset; after a late
		// claim the partition is still paused, so nothing was fetched from elsewhere.
		seek = w.position + 1
	case ok && w.token.Era > 0:
		// No position in a fence Baton has moved before (an operator's topic reset, which
		// moves every fence of a recreated topic to a new era with no position): the new
		// incarnation is read from its beginning, not from Kafka's committed offset, which
		// may name the old incarnation's offsets. An
		// offset below the log start is reset by franz-go to ConsumeResetOffset. Before a
		// restarted worker's inherited cursor (next case), which may name the old incarnation.
		seek = 0
	case ok && w.revived && w.from >= 0:
		// A restarted worker (the watchdog's revive, retryRefused) inherits the client's fetch
		// cursor, which passed every record its predecessor was handed and dropped; the sink
		// applied none of them, so fetching goes back to the first.
		seek = w.from
	}
	w.sought = seek // written on w's goroutine and under r.mu: read by both
	if seek >= 0 {
		r.seek(w, seek)
	}
	if !ok {
		r.setPause(w, pauseIdle, true)
	}
	if w.late {
		r.setPause(w, pauseClaiming, false)
	}
}
