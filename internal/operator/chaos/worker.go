package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/internal/operator/redislock"
	"github.com/batonhq/baton/outbox"
)

// Mode is how a worker protects its writes.
type Mode string

const (
	// Fenced is Baton: the consumer runtime and a fenced sink.
	Fenced Mode = "fenced"
	// Unfenced trusts Kafka's assignment alone: same consumer group, same writes, no fence.
	Unfenced Mode = "unfenced"
	// Lock is a naive lock: a Redis lease per partition checked before each write.
	Lock Mode = "lock"
)

// ParseMode parses a mode name.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case Fenced, Unfenced, Lock:
		return m, nil
	}
	return "", fmt.Errorf("chaos: unknown mode %q (want fenced, unfenced or lock)", s)
}

// WorkerConfig configures one worker process.
type WorkerConfig struct {
	ID             string
	Mode           Mode
	Brokers        []string
	Group, Topic   string
	SessionTimeout time.Duration // default 3s: short, so a frozen worker becomes a zombie quickly
	LockTTL        time.Duration // lock mode's lease; default SessionTimeout
	RedisAddr      string        // lock mode
	Logger         *slog.Logger
	// Kafka are extra client options for every client of the worker (TLS, SASL).
	Kafka []kgo.Opt
	// InstanceID makes the worker a static member (group.instance.id); "" for a dynamic one.
	InstanceID string
}

func (c *WorkerConfig) defaults() error {
	if c.ID == "" || c.Group == "" || c.Topic == "" || len(c.Brokers) == 0 {
		return errors.New("chaos: worker needs an id, a group, a topic and brokers")
	}
	if c.SessionTimeout <= 0 {
		c.SessionTimeout = 3 * time.Second
	}
	if c.LockTTL <= 0 {
		c.LockTTL = c.SessionTimeout
	}
	if c.Mode == Lock && c.RedisAddr == "" {
		return errors.New("chaos: lock mode needs a Redis address")
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return nil
}

func (c *WorkerConfig) kafkaOpts() []kgo.Opt {
	var static []kgo.Opt
	if c.InstanceID != "" {
		static = append(static, kgo.InstanceID(c.InstanceID))
	}
	return append(append([]kgo.Opt{
		kgo.SeedBrokers(c.Brokers...),
		kgo.ClientID(c.ID), // names the member in 'baton status' and on the status page
		kgo.SessionTimeout(c.SessionTimeout),
		kgo.HeartbeatInterval(c.SessionTimeout / 10),
		kgo.RebalanceTimeout(2 * c.SessionTimeout),
		kgo.FetchMaxWait(250 * time.Millisecond),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// The group leader assigns a grown topic's new partitions once its metadata shows them:
		// at its next refresh (franz-go's default: every 5 minutes; topic-grow).
		kgo.MetadataMaxAge(5 * time.Second),
		kgo.AlwaysRetryEOF(), // brokers restart during chaos runs; the configuration is known good
	}, static...), c.Kafka...)
}

// freezer implements the harness's freeze faults inside a worker. SIGUSR1 asks the worker to
// freeze itself at its next write, between deciding to write and reaching the database (a
// GC pause or VM freeze at the worst moment): it logs the batch it holds, then stops itself
// with SIGSTOP. The harness lets another member take over and then sends SIGCONT; the worker
// resumes and makes the write it was about to make, ignoring cancellation (as a paused
// program that has not yet looked at its context would), so the attempt reaches the database.
//
// The freeze happens between transactions: the freezer waits until no write of this process
// is in flight (gate) and holds new ones back while frozen. A process frozen inside a
// transaction would hold that transaction's locks (SQLite's single write lock, or PostgreSQL
// row locks) and block the takeover until it resumed; that is the delayed-commit case, which
// DESIGN.md discusses, not the paused-holder scenario this fault reproduces.
//
// SIGUSR2 arms the other case, the delayed commit: the worker freezes INSIDE its next
// transaction, after its writes and before its commit, holding the transaction open across the
// takeover. PostgreSQL's idle_in_transaction_session_timeout (which the workers set to twice
// their session timeout, as DESIGN.md recommends) then ends the held transaction, releasing
// the fence row to the new owner; the zombie's commit fails when it wakes.
//
// sigHold and sigHoldInTx arm the same two freezes as holds for the network faults: the write
// (or the transaction) waits for SIGCONT while the rest of the process runs on, heartbeating if
// its link lets it (faults_net.go).
type freezer struct {
	id      string
	db      DB
	armed   atomic.Bool
	delay   atomic.Bool
	run     atomic.Bool  // the armed freeze holds the write without stopping the process (network faults)
	gate    sync.RWMutex // writes hold it shared; a freeze holds it exclusively
	stopSig chan os.Signal
	cont    chan os.Signal // SIGCONT: the freeze is over

	mu   sync.Mutex
	held map[heldKey]int64 // the epoch of each write held across a freeze, by partition
}

type heldKey struct {
	topic string
	part  int32
}

// hold records that a write of topic/part at epoch was held across a freeze: every later write
// of that partition at that epoch or an earlier one is still the frozen assignment's.
func (f *freezer) hold(topic string, part int32, epoch int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.held == nil {
		f.held = map[heldKey]int64{}
	}
	if e, ok := f.held[heldKey{topic, part}]; !ok || epoch > e {
		f.held[heldKey{topic, part}] = epoch
	}
}

// resumed reports whether a write of topic/part under tok belongs to an assignment this process
// held across a freeze (an epoch at or below the held write's): after a takeover such a write
// is a zombie's, whatever the fence decided about it since (a re-claim, a recovery).
func (f *freezer) resumed(topic string, part int32, tok fence.Token) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.held[heldKey{topic, part}]
	return ok && tok.Epoch <= e
}

func newFreezer(id string, db DB) *freezer {
	f := &freezer{id: id, db: db, stopSig: make(chan os.Signal, 1), cont: make(chan os.Signal, 1)}
	signal.Notify(f.cont, syscall.SIGCONT)
	return f
}

// watch arms the freezer on SIGUSR1 (freeze before the next write) and SIGUSR2 (freeze inside
// the next transaction) until ctx ends; the caller waits for it.
func (f *freezer) watch(ctx context.Context) {
	signal.Notify(f.stopSig, syscall.SIGUSR1, syscall.SIGUSR2, sigHold, sigHoldInTx)
	defer signal.Stop(f.stopSig)
	defer signal.Stop(f.cont)
	for {
		select {
		case <-ctx.Done():
			return
		case sig := <-f.stopSig:
			f.run.Store(sig == sigHold || sig == sigHoldInTx)
			if sig == syscall.SIGUSR2 || sig == sigHoldInTx {
				f.delay.Store(true)
			} else {
				f.armed.Store(true)
			}
		}
	}
}

// point is called before each write attempt. If armed, it freezes the process and returns
// true after the process was continued: the attempt that follows is a zombie's.
func (f *freezer) point(ctx context.Context, topic string, part int32, tok fence.Token, first, last int64) bool {
	if !f.armed.CompareAndSwap(true, false) {
		return false
	}
	f.gate.Lock()
	defer f.gate.Unlock()
	logAttempt(ctx, f.db, f.id, topic, part, tok, first, last, OutcomeFrozen, false, f.what("before the write"))
	f.stopSelf()
	f.hold(topic, part, tok.Epoch)
	return true
}

// what describes a freeze about to happen at where.
func (f *freezer) what(where string) string {
	if f.run.Load() {
		return "holding " + where + " (the process runs on)"
	}
	return "freezing " + where
}

// stopSelf stops the whole process and returns once it was continued. A process-directed
// SIGSTOP is not synchronous for the thread that sends it (another thread may take the group
// stop while this one runs on for a moment), so wait for the SIGCONT that ends the freeze.
func (f *freezer) stopSelf() {
	for len(f.cont) > 0 {
		<-f.cont
	}
	if !f.run.Load() {
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	}
	select {
	case <-f.cont:
	case <-time.After(10 * time.Minute): // the harness died without continuing us
	}
}

// delayPoint is called inside a transaction, after its writes: if a delayed commit is armed
// it freezes the process there and returns true once continued.
func (f *freezer) delayPoint(ctx context.Context, topic string, part int32, tok fence.Token, last int64) bool {
	if !f.delay.CompareAndSwap(true, false) {
		return false
	}
	logAttempt(ctx, f.db, f.id, topic, part, tok, -1, last, OutcomeDelayed, false, f.what("inside the transaction, before commit"))
	f.stopSelf()
	f.hold(topic, part, tok.Epoch)
	return true
}

// write runs one write attempt under the gate, so a freeze never lands inside it.
func (f *freezer) write(fn func() error) error {
	f.gate.RLock()
	defer f.gate.RUnlock()
	return fn()
}

func logAttempt(ctx context.Context, db DB, worker, topic string, part int32, tok fence.Token, first, last int64, outcome string, zombie bool, detail string) {
	logAttemptCause(ctx, db, worker, topic, part, tok, first, last, outcome, "", zombie, false, detail)
}

// logResult logs a write attempt that ended with err (nil: committed): its outcome and, for an
// error, its cause and message.
func logResult(ctx context.Context, db DB, worker, topic string, part int32, tok fence.Token, first, last int64, zombie, resumed bool, err error) {
	if errors.Is(err, ErrNotDue) {
		return // a batch waiting for its time, not a write attempt
	}
	outcome, cause, detail := outcomeOf(err), "", ""
	if err != nil {
		detail = err.Error()
	}
	if outcome == OutcomeError {
		cause = causeOf(err)
	}
	logAttemptCause(ctx, db, worker, topic, part, tok, first, last, outcome, cause, zombie, resumed, detail)
}

func logAttemptCause(ctx context.Context, db DB, worker, topic string, part int32, tok fence.Token, first, last int64, outcome, cause string, zombie, resumed bool, detail string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = db.Exec(ctx, `INSERT INTO chaos_attempts (worker, topic, part, era, epoch, first_off, last_off, outcome, cause, zombie, resumed, detail, at_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)`, worker, topic, part, tok.Era, tok.Epoch, first, last, outcome, cause, zombie, resumed, detail, time.Now().UnixMilli())
}

func outcomeOf(err error) string {
	switch {
	case err == nil:
		return OutcomeCommitted
	case errors.Is(err, fence.ErrStale):
		return OutcomeStale
	case errors.Is(err, fence.ErrDuplicate):
		return OutcomeDuplicate
	}
	return OutcomeError
}

// Causes of write attempts that failed with an error (outcome "error"), as recorded in
// chaos_attempts.cause, so the verdict can say what the errors were. A PostgreSQL error is
// CausePostgres followed by its SQLSTATE ("postgres 57P01").
const (
	CauseCanceled   = "canceled"         // the attempt's context ended: its partition was revoked, or the worker was stopping
	CauseDeadline   = "deadline"         // the attempt's context deadline passed
	CauseSQLiteBusy = "sqlite busy"      // SQLite's write lock stayed busy past the busy timeout
	CausePostgres   = "postgres"         // a PostgreSQL error, with its SQLSTATE
	CauseNetwork    = "network"          // the connection to the database failed
	CauseRegression = "fence regression" // the fence saw an epoch regression it could not recover
	CauseConflict   = "fence conflict"   // a concurrent recovery advanced the era first
	CauseInvalid    = "fence invalid"    // the fence rejected an argument
	CauseBadRecord  = "bad record"       // a record that is not the workload's
	CauseOther      = "other"            // none of the above
)

// causeOf classifies a failed attempt's error by the errors in its chain (never by message).
// Cancellation wins: a write cut short by a revoke often carries the database's reaction too.
func causeOf(err error) string {
	var pgErr *pgconn.PgError
	var netErr net.Error
	var regErr *fence.RegressionError
	switch {
	case errors.Is(err, context.Canceled):
		return CauseCanceled
	case errors.Is(err, context.DeadlineExceeded):
		return CauseDeadline
	case errors.Is(err, sqlitefence.ErrBusy):
		return CauseSQLiteBusy
	case errors.As(err, &pgErr):
		return CausePostgres + " " + pgErr.Code
	case errors.As(err, &regErr):
		return CauseRegression
	case errors.Is(err, fence.ErrConflict):
		return CauseConflict
	case errors.Is(err, fence.ErrInvalid):
		return CauseInvalid
	case errors.Is(err, errBadRecord):
		return CauseBadRecord
	case errors.As(err, &netErr), pgconn.SafeToRetry(err):
		return CauseNetwork
	}
	return CauseOther
}

// attemptSink wraps the fenced sink: it applies the freeze faults and logs every write attempt
// with its outcome, outside the transaction, so refused attempts are counted too.
type attemptSink[T any] struct {
	fence.Sink[T]
	f    *freezer
	db   DB
	id   string
	wait *dueTable // batches that were not due: wait for them outside the transaction (apps)
}

// topicsSink is an attemptSink whose sink stores topic identities: the consumer looks for
// fence.Topics on the sink it is given, so the wrapper keeps it (without it the workers never
// compared a topic's identity, and a recreated or grown topic went unnoticed).
type topicsSink[T any] struct {
	*attemptSink[T]
	fence.Topics
}

// withTopics returns s, keeping inner's fence.Topics if it has it.
func withTopics[T any](s *attemptSink[T], inner fence.Sink[T]) fence.Sink[T] {
	if ts, ok := inner.(fence.Topics); ok {
		return topicsSink[T]{s, ts}
	}
	return s
}

func (s *attemptSink[T]) Apply(ctx context.Context, k fence.Key, t fence.Token, first, position int64, fn func(context.Context, T) error) error {
	if s.wait != nil {
		s.wait.wait(ctx, k)
	}
	zombie := s.f.point(ctx, k.Topic, k.Partition, t, first, position)
	resumed := !zombie && s.f.resumed(k.Topic, k.Partition, t)
	if zombie {
		ctx = context.WithoutCancel(ctx)
	}
	delayed := false
	err := s.f.write(func() error {
		return s.Sink.Apply(ctx, k, t, first, position, func(ctx context.Context, tx T) error {
			if err := fn(ctx, tx); err != nil {
				return err
			}
			delayed = delayed || s.f.delayPoint(ctx, k.Topic, k.Partition, t, position)
			return nil
		})
	})
	zombie = zombie || delayed
	logResult(ctx, s.db, s.id, k.Topic, k.Partition, t, first, position, zombie, resumed && !zombie, err)
	return err
}

// Outbox is what a fenced worker needs from an outbox store (pgoutbox.Store, sqliteoutbox.Store).
type Outbox[T any] interface {
	outbox.Store
	Append(ctx context.Context, tx T, src fence.Key, tok fence.Token, msgs ...outbox.Message) error
}

// RunBaseline runs a worker without Baton's fence: Unfenced trusts Kafka's assignment alone,
// Lock additionally takes a naive Redis lease per partition and checks it before each
// write. Both apply the same batches with the same read-modify-write as the fenced worker.
func RunBaseline(ctx context.Context, cfg WorkerConfig, db DB) error {
	if err := cfg.defaults(); err != nil {
		return err
	}
	var locks *redislock.Client
	if cfg.Mode == Lock {
		var err error
		if locks, err = redislock.Dial(ctx, cfg.RedisAddr); err != nil {
			return err
		}
		defer locks.Close()
	}
	f := newFreezer(cfg.ID, db)
	var wg sync.WaitGroup
	wctx, cancel := context.WithCancel(ctx)
	defer func() { cancel(); wg.Wait() }()
	wg.Add(1)
	go func() { defer wg.Done(); f.watch(wctx) }()

	var mu sync.Mutex // guards gens: written by the rebalance callback, read by the poll loop
	gens := map[int32]int64{}
	opts := append(cfg.kafkaOpts(),
		kgo.ConsumerGroup(cfg.Group), kgo.ConsumeTopics(cfg.Topic), kgo.DisableAutoCommit(),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.OnPartitionsAssigned(func(_ context.Context, cl *kgo.Client, m map[string][]int32) {
			_, gen := cl.GroupMetadata()
			mu.Lock()
			for _, p := range m[cfg.Topic] {
				gens[p] = int64(gen)
			}
			mu.Unlock()
		}),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	lockVal := fmt.Sprintf("%s-%d", cfg.ID, time.Now().UnixNano())
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var firstErr error
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 {
				return
			}
			mu.Lock()
			tok := fence.Token{Epoch: gens[p.Partition]}
			mu.Unlock()
			if locks != nil {
				key := fmt.Sprintf("chaos-lock/%s/%d", cfg.Group, p.Partition)
				if err := locks.Extend(ctx, key, lockVal, cfg.LockTTL); err != nil {
					ok, err := locks.TryAcquire(ctx, key, lockVal, cfg.LockTTL)
					if err != nil || !ok {
						// Someone else holds it: fetch these records again later.
						rewind(cl, cfg.Topic, p.Partition, p.Records[0].Offset)
						return
					}
				}
			}
			first, last := p.Records[0].Offset, p.Records[len(p.Records)-1].Offset
			zombie := f.point(ctx, p.Topic, p.Partition, tok, first, last)
			resumed := !zombie && f.resumed(p.Topic, p.Partition, tok)
			actx := ctx
			if zombie {
				actx = context.WithoutCancel(ctx)
			}
			err := f.write(func() error {
				tx, commit, rollback, err := db.Begin(actx)
				if err != nil {
					return err
				}
				if err = ApplyBatch(actx, tx, p.Partition, tok, cfg.ID, p.Records); err != nil {
					_ = rollback(actx)
					return err
				}
				return commit(actx)
			})
			logResult(actx, db, cfg.ID, p.Topic, p.Partition, tok, first, last, zombie, resumed, err)
			if err != nil {
				firstErr = err
				rewind(cl, cfg.Topic, p.Partition, first) // retry the batch, as Baton would
				return
			}
			_ = cl.CommitRecords(ctx, p.Records[len(p.Records)-1])
		})
		if firstErr != nil && ctx.Err() == nil {
			cfg.Logger.Warn("baseline write failed", "err", firstErr)
		}
	}
}

// rewind makes the client fetch partition p again from offset.
func rewind(cl *kgo.Client, topic string, p int32, offset int64) {
	cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{topic: {p: {Epoch: -1, Offset: offset}}})
}
