package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/batonhq/baton/fence"
)

// Option configures a [Consumer]. Invalid values make [New] fail with [ErrInvalidOption].
type Option func(*config) error

type config struct {
	kafka              []kgo.Opt
	logger             *slog.Logger
	meters             metric.MeterProvider
	tracers            trace.TracerProvider
	propagator         propagation.TextMapPropagator
	maxInflightPart    int
	maxInflight        int
	deadLetterTopic    string
	retryMin, retryMax time.Duration
	unusableAfter      time.Duration
	lagLook            time.Duration
	stalledAfter       time.Duration
	recoverRegressions bool
	epochs             epochSource
	epochsSet          bool   // withEpochs was given
	protocol           string // GroupProtocol, or "" for the epoch source's
	claimWait          time.Duration
	afterCommit        func(ctx context.Context, k fence.Key, t fence.Token) error
	afterCommitIdle    time.Duration
	lanes              int
	prepare            func(ctx context.Context, k fence.Key, t fence.Token, r *kgo.Record) (any, error)
	factory            any // PerPartition's Factory[Tx], checked against the sink's Tx by New
	deadLetters        any // FencedDeadLetters' function, checked likewise
	admitDeadLetters   any // AdmitDeadLetters' function, checked likewise
}

func defaults() config {
	return config{
		logger:             slog.Default(),
		meters:             otel.GetMeterProvider(),
		tracers:            otel.GetTracerProvider(),
		propagator:         otel.GetTextMapPropagator(),
		maxInflightPart:    1000,
		maxInflight:        10000,
		retryMin:           100 * time.Millisecond,
		retryMax:           10 * time.Second,
		unusableAfter:      30 * time.Second,
		lagLook:            5 * time.Second,
		stalledAfter:       30 * time.Second,
		recoverRegressions: true,
		epochs:             classicGeneration{},
		claimWait:          10 * time.Second,
		afterCommitIdle:    time.Second,
	}
}

// Kafka passes options straight to the franz-go client: seed brokers (required), TLS, SASL,
// session and rebalance timeouts, fetch sizes. The consumer adds ConsumerGroup,
// ConsumeTopics, its rebalance callbacks and AutoCommitMarks (only offsets of applied batches
// are committed); it starts from its own defaults (the cooperative-sticky balancer and a
// 500ms heartbeat interval: see Handovers in the package documentation; fetches of at most
// 64 KiB per partition and a 100ms fetch max wait, so that a fetch holds about what the
// backpressure lets through and a resumed partition waits at most 100ms behind an idle
// fetch), which these options override.
//
// The options Baton owns are refused with [ErrInvalidOption], naming the option: ConsumerGroup,
// ShareGroup, ConsumeRegex, ConsumePartitions, OnPartitionsAssigned, OnPartitionsRevoked,
// OnPartitionsLost, DisableAutoCommit, AutoCommitMarks, GreedyAutoCommit and
// AutoCommitCallback, BlockRebalanceOnPoll, and a ConsumeResetOffset or ConsumeStartOffset
// other than kgo.NewOffset().AtStart() (the log start: see kafkaDefaults), all by [New]. A
// ConsumeTopics among them is replaced by New's topics.
func Kafka(opts ...kgo.Opt) Option {
	return func(c *config) error {
		for i, o := range opts {
			if o == nil {
				return fmt.Errorf("%w: Kafka option %d is nil", ErrInvalidOption, i)
			}
		}
		c.kafka = append(c.kafka, opts...)
		return nil
	}
}

// Logger sets the structured logger. Default: slog.Default(), because stale refusals and epoch
// regressions must never be silent.
func Logger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidOption)
		}
		c.logger = l
		return nil
	}
}

// Telemetry sets where the consumer's OpenTelemetry signals go: its metrics (meters), its
// batch spans (tracers) and the propagator that extracts producers' trace contexts from record
// headers, to link batch spans to them (propagator). A nil argument keeps its default: the
// OpenTelemetry globals (otel.GetMeterProvider(), otel.GetTracerProvider(),
// otel.GetTextMapPropagator()).
func Telemetry(meters metric.MeterProvider, tracers trace.TracerProvider, propagator propagation.TextMapPropagator) Option {
	return func(c *config) error {
		if meters != nil {
			c.meters = meters
		}
		if tracers != nil {
			c.tracers = tracers
		}
		if propagator != nil {
			c.propagator = propagator
		}
		return nil
	}
}

// MaxInflightPerPartition bounds the records fetched for one partition and not yet applied;
// past it the partition's fetching is paused until half of them are done. It also bounds a
// batch: one transaction applies at most n records (a larger fetch is split). Default 1000.
func MaxInflightPerPartition(n int) Option {
	return func(c *config) error {
		if n <= 0 {
			return fmt.Errorf("%w: MaxInflightPerPartition %d", ErrInvalidOption, n)
		}
		c.maxInflightPart = n
		return nil
	}
}

// MaxInflight bounds the records fetched and not yet applied over all partitions; past it the
// consumer stops polling until some are done. A poll hands every partition's buffered records
// to its worker at once (handing over only part would starve the other partitions behind the
// first one's backlog), so the bound is soft: it can be exceeded by what the client had
// buffered, at most one fetch response per broker (kgo.FetchMaxBytes). Default 10000.
func MaxInflight(n int) Option {
	return func(c *config) error {
		if n <= 0 {
			return fmt.Errorf("%w: MaxInflight %d", ErrInvalidOption, n)
		}
		c.maxInflight = n
		return nil
	}
}

// DeadLetterTopic sets the topic poison records go to. Default: the source topic's name plus
// ".dlq" (a poison record of "orders" goes to "orders.dlq"). The copy has the record's key,
// value and timestamp, its headers without any baton.dlq.* one, then Baton's: baton.dlq.reason
// (the error, at most 1 KiB), baton.dlq.group, baton.dlq.topic, baton.dlq.partition,
// baton.dlq.offset and baton.dlq.token (the owner's token). The topic must exist (or be
// auto-created): until the dead-letter produce succeeds, the partition retries and stalls
// observably rather than dropping the record. With [FencedDeadLetters]
// (outboxconsumer.DeadLetters), the copy to this topic is written in the fenced transaction
// instead, and the outbox's relay produces it: the partition goes on at once, and a topic that
// stays missing (or unauthorized) for the relay's GiveUpAfter makes the relay set the copy
// aside as an undeliverable outbox row (kept with its reason, not re-driven automatically)
// instead of stalling the partition.
func DeadLetterTopic(name string) Option {
	return func(c *config) error {
		if err := validTopic(name); err != nil {
			return fmt.Errorf("%w: dead-letter topic: %w", ErrInvalidOption, err)
		}
		c.deadLetterTopic = name
		return nil
	}
}

// RetryBackoff sets the bounds of the exponential backoff between retries of a batch (or a
// claim) that failed transiently: the first wait is first, each next one doubles, up to limit.
// Default 100ms to 10s.
func RetryBackoff(first, limit time.Duration) Option {
	return func(c *config) error {
		if first <= 0 || limit < first {
			return fmt.Errorf("%w: RetryBackoff(%v, %v): want 0 < first <= limit", ErrInvalidOption, first, limit)
		}
		c.retryMin, c.retryMax = first, limit
		return nil
	}
}

// RecoverRegressions sets whether an epoch regression proven with the group coordinator is
// recovered through [fence.Sink.Recover] (recorded, era+1). Default true: see the package
// documentation for why. When false the partition stays unprocessed and every claim attempt
// reports the *fence.RegressionError.
func RecoverRegressions(on bool) Option {
	return func(c *config) error {
		c.recoverRegressions = on
		return nil
	}
}

// withEpochs sets where a partition's epoch comes from, for tests; the group protocol picks it
// otherwise.
func withEpochs(s epochSource) Option {
	return func(c *config) error {
		if s == nil {
			return fmt.Errorf("%w: nil epoch source", ErrInvalidOption)
		}
		c.epochs, c.epochsSet = s, true
		return nil
	}
}

// claimWait bounds how long the assignment callback waits for the claims of newly assigned
// partitions before letting the rebalance finish; partitions still claiming stay paused until
// their claim completes. Keep it well below the rebalance timeout. Default 10s.
func claimWait(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: ClaimWait %v", ErrInvalidOption, d)
		}
		c.claimWait = d
		return nil
	}
}

// unusableAfter sets how long a partition's claim may fail with nothing but errors that say
// this member cannot use the sink (unusable) before Run gives up and leaves the group
// (errSinkUnusable). Default 30s.
func unusableAfter(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: unusable-sink bound %v", ErrInvalidOption, d)
		}
		c.unusableAfter = d
		return nil
	}
}

// AfterCommit sets fn to run in each partition's goroutine after its batches commit, and
// every idle interval while the partition has nothing to apply (so work fn could not finish,
// e.g. rows not relayed while Kafka was down, is retried without new records). Default: none;
// idle interval 1s.
//
// fn is called by a partition's own goroutine, under its ownership and token,
// after the partition's batches commit: the place to relay that partition's outbox rows
// (outbox.Relay.AfterCommit). It is never called concurrently for the same partition, and
// never after the partition was revoked or lost (its ctx is the partition's). An error is
// logged and counted; the call is made again after the next commit or within the idle
// interval, so work it leaves (undelivered rows) is picked up later.
func AfterCommit(fn func(ctx context.Context, k fence.Key, t fence.Token) error, idle time.Duration) Option {
	return func(c *config) error {
		if fn == nil {
			return fmt.Errorf("%w: nil AfterCommit func", ErrInvalidOption)
		}
		if idle <= 0 {
			return fmt.Errorf("%w: AfterCommit idle interval %v", ErrInvalidOption, idle)
		}
		c.afterCommit, c.afterCommitIdle = fn, idle
		return nil
	}
}

// Lanes runs prepare for every record before the handler applies it, in up to n lanes per
// partition: one key's records on one lane at a time in offset order, every lane under the
// partition's single token. The partition's goroutine stays its only writer: it applies the
// contiguous prefix of prepared records (never past one still in a lane) in fenced
// transactions, so a crash or a takeover loses and duplicates nothing. n is 1 to 256 (1
// prepares one record at a time, overlapped with the writer's transactions). Default: no
// lanes, no prepare stage.
//
// prepare is the first stage of handling a record: the slow part (a remote call to a device
// gateway or a payment API) that needs no transaction. It is called for every record, in the
// partition's lanes, outside the sink's transaction, with the partition's fence key k and the
// token t it is owned with; its results reach the handler in [Batch.Prepared], and the handler
// writes them in the fenced transaction.
//
// It is called concurrently for records of different keys of one partition, never
// concurrently for two records of the same key, and for one key's records in offset order.
// ctx is cancelled when this member loses the partition (or the partition stops); a revoke
// waits for every call to return, as it waits for the handler, so it must honour ctx.
//
// The lanes run ahead of the writer: a key's next record may be prepared before the handler
// has committed its previous one (or even started), so the function must not read what the
// handler writes for the key's earlier records; a step that depends on them belongs in the
// handler. A result may also be applied under a later token than the one it was prepared
// under (t): when the partition is re-claimed while its records are in the window (it was
// kept at a later generation, or its fence recovered), records prepared under the earlier
// token are applied under the new one, with those results in [Batch.Prepared]. A handler
// that drops records from a batch must drop their Prepared results with them.
//
// Its effects are not fenced: a record prepared and not yet applied when the partition moves
// is prepared again by the next owner, and a zombie whose session expired keeps preparing
// until it notices (its writes are refused). So it must be safe to repeat and to run on a
// member that no longer owns the partition: a read, or a call with an idempotency key. A side
// effect that must happen once belongs in the outbox, appended by the handler in the fenced
// transaction.
//
// An error is handled like the handler's: [Permanent] makes the record poison (the records
// before it are applied, it is dead-lettered, the records after it go on); any other error is
// retried on the record's lane with backoff, the same record again.
func Lanes(n int, prepare func(ctx context.Context, k fence.Key, t fence.Token, r *kgo.Record) (any, error)) Option {
	return func(c *config) error {
		if n < 1 || n > maxLanes {
			return fmt.Errorf("%w: Lanes %d, want 1..%d", ErrInvalidOption, n, maxLanes)
		}
		if prepare == nil {
			return fmt.Errorf("%w: Lanes with a nil prepare function", ErrInvalidOption)
		}
		c.lanes, c.prepare = n, prepare
		return nil
	}
}

// PerPartition builds each partition's handler with factory when this member is assigned the
// partition (and again when it is claimed with a new token), for handlers that keep
// per-partition state. [New]'s handler must then be nil; both, or a factory of another
// transaction type than the sink's, make New fail with [ErrInvalidOption]. A factory's error
// stops [Consumer.Run].
func PerPartition[Tx any](factory Factory[Tx]) Option {
	return func(c *config) error {
		if factory == nil {
			return fmt.Errorf("%w: nil PerPartition factory", ErrInvalidOption)
		}
		if c.factory != nil {
			return fmt.Errorf("%w: PerPartition given twice", ErrInvalidOption)
		}
		c.factory = factory
		return nil
	}
}

// FencedDeadLetters makes the consumer dead-letter a poison record through fn, which writes
// its dead-letter copy d in the fenced transaction tx, inside the
// fenced transaction that advances the fence over the record, instead of producing it to
// Kafka. b holds that record alone (b.Key, b.Token: the partition and the token the
// transaction is fenced with; with [Lanes], b.Prepared its prepared result, nil if its
// preparation failed for good) and d is the record the consumer would have produced (the
// dead-letter topic, the poison record's key, value and headers, and the baton.dlq.*
// headers). The copy commits with the fence advance or not at all, so a zombie whose
// transaction the database ended (idle_in_transaction_session_timeout) never dead-letters a
// record. outboxconsumer.DeadLetters is this option with an append to the fenced outbox,
// relayed by the partition's owner.
//
// An error rolls the transaction back; it is retried like a handler's error, except that an
// error marked [Permanent] (a copy the store can never take) stops the partition with an
// ERROR log. fn is never called concurrently for the same partition. Its transaction type
// must be the sink's, and it may be given once (outboxconsumer.DeadLetters counts), or [New]
// fails with [ErrInvalidOption].
func FencedDeadLetters[Tx any](fn func(ctx context.Context, tx Tx, b *Batch, d *kgo.Record) error) Option {
	return func(c *config) error {
		if fn == nil {
			return fmt.Errorf("%w: nil FencedDeadLetters function", ErrInvalidOption)
		}
		if c.deadLetters != nil {
			return fmt.Errorf("%w: FencedDeadLetters given twice (outboxconsumer.DeadLetters is one)", ErrInvalidOption)
		}
		c.deadLetters = fn
		return nil
	}
}

// AdmitDeadLetters makes every transaction that dead-letters a record (a handler's poison
// record, or one whose [Lanes] preparation failed for good; produced directly or through
// [FencedDeadLetters]) first call fn with the record, in that transaction, before the copy is
// written: fn admits r where the receiver deduplicates, and its admission commits with the
// dead letter and the fence advance, or not at all. fn's verdict decides: [fence.Admitted],
// the copy is written; [fence.Duplicate] (a copy of a record already applied or
// dead-lettered) or [fence.Stale] (a deposed producer's record), no copy is written and the
// fence advances over r, a duplicate counted in baton.consumer.records.duplicates_skipped (a
// stale record is the receiver's to count, as its inbox does). So a record is applied once or
// dead-lettered once, never both and never twice, across the copies a relay re-publishes.
// outboxconsumer.AdmitDeadLetters is this option with the inbox of outboxconsumer.Handler, and
// a receiver behind that handler needs it.
//
// An error, or a verdict that is none of the three, rolls the transaction back and is
// retried, except an error marked [Permanent], which stops the partition with an ERROR log.
// fn is never called concurrently for the same partition. Its transaction type must be the
// sink's, and it may be given once, or [New] fails with [ErrInvalidOption].
func AdmitDeadLetters[Tx any](fn func(ctx context.Context, tx Tx, r *kgo.Record) (fence.Verdict, error)) Option {
	return func(c *config) error {
		if fn == nil {
			return fmt.Errorf("%w: nil AdmitDeadLetters function", ErrInvalidOption)
		}
		if c.admitDeadLetters != nil {
			return fmt.Errorf("%w: AdmitDeadLetters given twice (outboxconsumer.AdmitDeadLetters is one)", ErrInvalidOption)
		}
		c.admitDeadLetters = fn
		return nil
	}
}

// handlers returns the factory of New's handler or of PerPartition's factory: exactly one
// of them must be given.
func handlers[Tx any](h Handler[Tx], factory any) (Factory[Tx], error) {
	switch {
	case h != nil && factory != nil:
		return nil, fmt.Errorf("%w: both a handler and PerPartition: pass a nil handler with PerPartition", ErrInvalidOption)
	case h != nil:
		return func(context.Context, fence.Key, fence.Token) (Handler[Tx], error) { return h, nil }, nil
	case factory == nil:
		return nil, errNilHandler
	}
	f, ok := factory.(Factory[Tx])
	if !ok {
		return nil, fmt.Errorf("%w: PerPartition builds handlers of %s, the sink's transactions are %s", ErrInvalidOption, txOf(factory), txName[Tx]())
	}
	return f, nil
}

// txName names the type Tx; txOf the transaction type of a PerPartition or FencedDeadLetters
// function, for New's errors.
func txName[Tx any]() string { return reflect.TypeFor[Tx]().String() }

func txOf(f any) string {
	t := reflect.TypeOf(f)
	if t.Kind() == reflect.Func && t.NumOut() >= 1 && t.Out(0).Kind() == reflect.Func && t.Out(0).NumIn() >= 2 {
		return t.Out(0).In(1).String() // Factory: its Handler's (ctx, tx, b)
	}
	if t.Kind() == reflect.Func && t.NumIn() >= 2 {
		return t.In(1).String() // FencedDeadLetters, AdmitDeadLetters: (ctx, tx, ...)
	}
	return t.String()
}

// GroupProtocol selects the consumer group protocol, by the names of Kafka's consumer config
// group.protocol: "classic" (JoinGroup/SyncGroup; the token's epoch is the group generation)
// or "consumer" (KIP-848, Kafka 4.0+, proven on 4.3+; the epoch is the partition's assignment
// epoch of KIP-1251, and franz-go's kgo.ServerSideBalancer is added). Any other name makes
// [New] fail with [ErrInvalidOption]. Default "classic". See DESIGN.md, "KIP-848 groups", for
// why classic stays the default.
func GroupProtocol(name string) Option {
	return func(c *config) error {
		switch name {
		case protocolClassic, protocolConsumer:
			c.protocol = name
			return nil
		}
		return fmt.Errorf("%w: GroupProtocol %q: want %q or %q", ErrInvalidOption, name, protocolClassic, protocolConsumer)
	}
}

// kafkaDefaults are the client settings the consumer starts from, before the [Kafka] options
// (which override any of them): a client id naming the process (defaultClientID), the
// cooperative-sticky balancer, and a heartbeat interval
// that makes a handover fast. A member learns that the group is rebalancing only from its
// next heartbeat, so the interval bounds how long the partitions of a member that left (or
// whose session expired) wait for the others: franz-go's 3s made a graceful handover take 3s;
// 500ms brings it under a second, for two heartbeats a second per member. The metadata min
// age made no measured difference to a handover and stays franz-go's. So does the session
// timeout (45s, Kafka's default): a crash takeover takes it plus about a heartbeat
// interval; set kgo.SessionTimeout for faster takeovers at the risk of expiring members that
// pause. Measured by 'baton bench handover' (see Handovers in the package documentation).
//
// A resume point below the log start resumes at the log start (kgo.ConsumeResetOffset, the
// only value [New] accepts): nothing still in the log is skipped.
//
// Two fetch settings follow from the backpressure ([MaxInflightPerPartition] pauses a
// partition that has that many records in flight). A fetch of franz-go's default size (1 MiB
// of a partition, compressed) of small records holds tens of thousands of records per
// partition: all of them decoded and held in memory before the first is applied, most of
// them past the bound, and those of paused partitions dropped and fetched again. 64 KiB of a
// partition is still hundreds of records of a hundred bytes, and bounds the heap of a member
// of many partitions; while a transaction runs, the next fetches queue for the one after it.
// And a partition resumed while a fetch is in flight joins only the next fetch: when every
// partition in the flight is caught up, the broker holds it for the fetch max wait,
// franz-go's 5s, and the resumed partition waits as long with records to fetch. 100ms bounds
// that wait, at about ten empty fetches a second per broker for an idle member.
func kafkaDefaults() []kgo.Opt {
	return []kgo.Opt{
		kgo.ClientID(defaultClientID()),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.HeartbeatInterval(500 * time.Millisecond),
		kgo.ConsumeResetOffset(earliest),
		kgo.FetchMaxPartitionBytes(64 << 10),
		kgo.FetchMaxWait(100 * time.Millisecond),
	}
}

// defaultClientID is the client id of a member whose Kafka options set none:
// "baton-<host>-<pid>", so that the group's members (what the coordinator and baton status
// show as a partition's owner, client id @ address) tell processes apart; franz-go's default,
// "kgo", is the same for all. Characters of the host name outside [A-Za-z0-9._-] become "_".
func defaultClientID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	b := []byte(host)
	for i, c := range b {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			b[i] = '_'
		}
	}
	return "baton-" + string(b) + "-" + strconv.Itoa(os.Getpid())
}
