package consumer

import (
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// DeadLetterHeaders exposes deadLetterHeaders to the external tests (the fuzzer).
var DeadLetterHeaders = deadLetterHeaders

// SkewWatchdog moves the clock the watchdog of c's running Run judges the session by, by d,
// until the watchdog fires (0 restores it). It does nothing when c is not running.
func SkewWatchdog[Tx any](c *Consumer[Tx], d time.Duration) {
	if r := c.cur.Load(); r != nil {
		r.wd.skew.Store(int64(d))
	}
}

// MaxDeadLetterReason exposes the bound of the baton.dlq.reason header.
const MaxDeadLetterReason = maxDeadLetterReason

// Sessions returns how many group sessions (OnPartitionsAssigned calls) the running Run of c
// has seen; 0 when none runs.
func Sessions[Tx any](c *Consumer[Tx]) int64 {
	if r := c.cur.Load(); r != nil {
		return r.sessions.Load()
	}
	return 0
}

// EpochSource is the epoch source, for tests that give their own.
type EpochSource = epochSource

// Epochs sets the epoch source.
func Epochs(s EpochSource) Option { return withEpochs(s) }

// ClassicGeneration and AssignmentEpochs are the two protocols' epoch sources.
func ClassicGeneration() EpochSource { return classicGeneration{} }
func AssignmentEpochs() EpochSource  { return assignmentEpochs{} }

// The group protocols' names.
const (
	ProtocolClassic  = protocolClassic
	ProtocolConsumer = protocolConsumer
)

// The sentinels of New's misconfigurations and of a permanent error, and the dead-letter
// headers' names.
var (
	ErrNoGroup      = errNoGroup
	ErrNoTopics     = errNoTopics
	ErrInvalidTopic = errInvalidTopic
	ErrNilSink      = errNilSink
	ErrNilHandler   = errNilHandler
	ErrNoBrokers    = errNoBrokers
	ErrOwnedOption  = errOwnedOption
	ErrPermanent    = errPermanent
	ErrSinkUnusable = errSinkUnusable
)

const (
	HeaderDLQReason    = headerDLQReason
	HeaderDLQGroup     = headerDLQGroup
	HeaderDLQTopic     = headerDLQTopic
	HeaderDLQPartition = headerDLQPartition
	HeaderDLQOffset    = headerDLQOffset
	HeaderDLQToken     = headerDLQToken
)

// MeterProvider, TracerProvider and TextMapPropagator set one signal of Telemetry each.
func MeterProvider(p metric.MeterProvider) Option              { return Telemetry(p, nil, nil) }
func TracerProvider(p trace.TracerProvider) Option             { return Telemetry(nil, p, nil) }
func TextMapPropagator(p propagation.TextMapPropagator) Option { return Telemetry(nil, nil, p) }

// ClaimWait bounds the assignment callback's wait for the claims.
func ClaimWait(d time.Duration) Option { return claimWait(d) }

// UnusableSinkAfter bounds how long a claim may fail with errors that say the member cannot
// use the sink before Run leaves the group.
func UnusableSinkAfter(d time.Duration) Option { return unusableAfter(d) }

// LagLook sets how often Run lists the end offsets of its partitions for the lag gauge and
// checks that its topics exist.
func LagLook(d time.Duration) Option {
	return func(c *config) error { c.lagLook = d; return nil }
}

// StalledAfter sets how long a step may keep failing before its retries are logged at ERROR.
func StalledAfter(d time.Duration) Option {
	return func(c *config) error { c.stalledAfter = d; return nil }
}
