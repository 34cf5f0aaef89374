package consumer

import (
	"context"
	"fmt"
	"log/slog"
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
	recoverRegressions bool
	epochs             EpochSource
	epochsSet          bool   // Epochs was given
	protocol           string // GroupProtocol, or "" for the epoch source's
	claimWait          time.Duration
	afterCommit        AfterCommitFunc
	afterCommitIdle    time.Duration
	lanes              int
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
		recoverRegressions: true,
		epochs:             ClassicGeneration(),
		claimWait:          10 * time.Second,
		afterCommitIdle:    time.Second,
		lanes:              1,
	}
}

// Kafka passes options straight to the franz-go client: seed brokers (required), TLS, SASL,
// session and rebalance timeouts, fetch sizes. The consumer adds ConsumerGroup,
// ConsumeTopics, its rebalance callbacks and AutoCommitMarks (only offsets of applied batches
// are committed); it starts from its own defaults (the cooperative-sticky balancer and a
// 500ms heartbeat interval: see Handovers in the package documentation), which these options
// override.
//
// The options Baton owns are refused with [ErrOwnedOption], naming the option: ConsumerGroup,
// ShareGroup, ConsumeRegex, ConsumePartitions, OnPartitionsAssigned, OnPartitionsRevoked,
// OnPartitionsLost, DisableAutoCommit, AutoCommitMarks, GreedyAutoCommit and
// AutoCommitCallback by [New]; BlockRebalanceOnPoll by [Consumer.Run], before it joins the
// group (franz-go's validation, the only look at options it offers without a client, does not
// reveal it). A ConsumeTopics among them is replaced by New's topics.
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

// MeterProvider sets the OpenTelemetry meter provider. Default: otel.GetMeterProvider().
func MeterProvider(p metric.MeterProvider) Option {
	return func(c *config) error {
		if p == nil {
			return fmt.Errorf("%w: nil meter provider", ErrInvalidOption)
		}
		c.meters = p
		return nil
	}
}

// TracerProvider sets the OpenTelemetry tracer provider. Default: otel.GetTracerProvider().
func TracerProvider(p trace.TracerProvider) Option {
	return func(c *config) error {
		if p == nil {
			return fmt.Errorf("%w: nil tracer provider", ErrInvalidOption)
		}
		c.tracers = p
		return nil
	}
}

// TextMapPropagator sets the propagator that extracts producers' trace contexts from record
// headers (to link batch spans to them). Default: otel.GetTextMapPropagator().
func TextMapPropagator(p propagation.TextMapPropagator) Option {
	return func(c *config) error {
		if p == nil {
			return fmt.Errorf("%w: nil propagator", ErrInvalidOption)
		}
		c.propagator = p
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
// ".dlq" (a poison record of "orders" goes to "orders.dlq"). The topic must exist (or be
// auto-created): until the dead-letter produce succeeds, the partition retries and stalls
// observably rather than dropping the record. With a handler that is a [DeadLetterer]
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

// Epochs sets where a partition's epoch comes from. Default: [ClassicGeneration].
func Epochs(s EpochSource) Option {
	return func(c *config) error {
		if s == nil {
			return fmt.Errorf("%w: nil epoch source", ErrInvalidOption)
		}
		c.epochs, c.epochsSet = s, true
		return nil
	}
}

// ClaimWait bounds how long the assignment callback waits for the claims of newly assigned
// partitions before letting the rebalance finish; partitions still claiming stay paused until
// their claim completes. Keep it well below the rebalance timeout. Default 10s.
func ClaimWait(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: ClaimWait %v", ErrInvalidOption, d)
		}
		c.claimWait = d
		return nil
	}
}

// AfterCommitFunc is called by a partition's own goroutine, under its ownership and token,
// after the partition's batches commit: the place to relay that partition's outbox rows
// (outbox.Relay.AfterCommit). It is never called concurrently for the same partition, and
// never after the partition was revoked or lost (its ctx is the partition's). An error is
// logged and counted; the call is made again after the next commit or within the idle
// interval, so work it leaves (undelivered rows) is picked up later.
type AfterCommitFunc func(ctx context.Context, k fence.Key, t fence.Token) error

// AfterCommit sets fn to run in each partition's goroutine after its batches commit, and
// every idle interval while the partition has nothing to apply (so work fn could not finish,
// e.g. rows not relayed while Kafka was down, is retried without new records). Default: none;
// idle interval 1s.
func AfterCommit(fn AfterCommitFunc, idle time.Duration) Option {
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

// Lanes sets how many records of one partition may run [Preparer.Prepare] at once: up to n
// lanes per partition, one key's records on one lane at a time in offset order, every lane under
// the partition's single token. The partition's goroutine stays its only writer: it applies
// the contiguous prefix of prepared records (never past one still in a lane) in fenced
// transactions, so a crash or a takeover loses and duplicates nothing. Lanes apply to handlers
// that implement Preparer; a plain [Handler] runs as before. Default 1 (Prepare runs one
// record at a time, overlapped with the writer's transactions); at most 256.
func Lanes(n int) Option {
	return func(c *config) error {
		if n < 1 || n > maxLanes {
			return fmt.Errorf("%w: Lanes %d, want 1..%d", ErrInvalidOption, n, maxLanes)
		}
		c.lanes = n
		return nil
	}
}

// GroupProtocol selects the consumer group protocol, by the names of Kafka's consumer config
// group.protocol: [ProtocolClassic] (JoinGroup/SyncGroup; the token's epoch is the group
// generation, [ClassicGeneration]) or [ProtocolConsumer] (KIP-848, Kafka 4.0+, proven on 4.3+;
// the epoch is the partition's assignment epoch, [AssignmentEpochs]). Without [Epochs] the
// protocol's own epoch source is used; with an epoch source of the other protocol, [New]
// fails. Default: the epoch source's protocol, classic unless [Epochs] says otherwise. See
// DESIGN.md, "KIP-848 groups", for why classic stays the default.
func GroupProtocol(name string) Option {
	return func(c *config) error {
		switch name {
		case ProtocolClassic, ProtocolConsumer:
			c.protocol = name
			return nil
		}
		return fmt.Errorf("%w: GroupProtocol %q: want %q or %q", ErrInvalidOption, name, ProtocolClassic, ProtocolConsumer)
	}
}

// kafkaDefaults are the client settings the consumer starts from, before the [Kafka] options
// (which override any of them): the cooperative-sticky balancer, and a heartbeat interval
// that makes a handover fast. A member learns that the group is rebalancing only from its
// next heartbeat, so the interval bounds how long the partitions of a member that left (or
// whose session expired) wait for the others: franz-go's 3s made a graceful handover take 3s;
// 500ms brings it under a second, for two heartbeats a second per member. The fetch max wait
// and the metadata min age, also suspects, made no measured difference (franz-go restarts its
// fetch session when partitions are assigned) and stay franz-go's. So does the session
// timeout (45s, Kafka's default): a crash takeover takes it plus about a heartbeat
// interval; set kgo.SessionTimeout for faster takeovers at the risk of expiring members that
// pause. Measured by 'baton bench handover' (see Handovers in the package documentation).
func kafkaDefaults() []kgo.Opt {
	return []kgo.Opt{
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.HeartbeatInterval(500 * time.Millisecond),
	}
}
