package outbox

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/batonhq/baton/fence"
)

const instrumentation = "github.com/batonhq/baton/outbox"

// telemetry holds the relay's or inbox's instruments; providers come from options and default
// to the otel globals (no-ops unless the application installed an SDK).
type telemetry struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator

	backlog      metric.Int64Gauge
	oldest       metric.Float64Gauge
	delivered    metric.Int64Counter
	deadLettered metric.Int64Counter
	latency      metric.Float64Histogram
	admitted     metric.Int64Counter
	drops        metric.Int64Counter
}

type telemetryConfig struct {
	meters  metric.MeterProvider
	tracers trace.TracerProvider
}

// commitToAckBounds are the commit-to-acknowledgement histogram's bucket bounds, in seconds as
// its unit: from a relay flushing right after the commit to one that waited out an outage.
// (The SDK's default bounds, 0, 5, 10 ... 10000, are meant for milliseconds.)
var commitToAckBounds = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}

func (c telemetryConfig) build() (*telemetry, error) {
	mp, tp := c.meters, c.tracers
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	m := mp.Meter(instrumentation)
	t := &telemetry{tracer: tp.Tracer(instrumentation), prop: propagation.TraceContext{}}
	var err error
	if t.backlog, err = m.Int64Gauge("baton.outbox.backlog",
		metric.WithDescription("Outbox rows of a source partition appended but not yet delivered, as of the last flush."),
		metric.WithUnit("{message}")); err != nil {
		return nil, err
	}
	if t.oldest, err = m.Float64Gauge("baton.outbox.oldest_pending_age",
		metric.WithDescription("Age of a source partition's oldest undelivered outbox row (relay clock minus the row's append time), as of the last flush; 0 when nothing is pending. A row that cannot be delivered shows as a rising age."),
		metric.WithUnit("s")); err != nil {
		return nil, err
	}
	if t.deadLettered, err = m.Int64Counter("baton.outbox.dead_lettered",
		metric.WithDescription("Outbox rows the relay gave up on and dead-lettered, by reason."),
		metric.WithUnit("{message}")); err != nil {
		return nil, err
	}
	if t.delivered, err = m.Int64Counter("baton.outbox.delivered",
		metric.WithDescription("Outbox rows published, acknowledged and marked delivered."),
		metric.WithUnit("{message}")); err != nil {
		return nil, err
	}
	if t.latency, err = m.Float64Histogram("baton.outbox.commit_to_ack",
		metric.WithDescription("Time from a row's append (store clock) to the broker's acknowledgement (relay clock)."),
		metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(commitToAckBounds...)); err != nil {
		return nil, err
	}
	if t.admitted, err = m.Int64Counter("baton.inbox.admitted",
		metric.WithDescription("Records the inbox admitted."),
		metric.WithUnit("{message}")); err != nil {
		return nil, err
	}
	if t.drops, err = m.Int64Counter("baton.inbox.drops",
		metric.WithDescription("Records the inbox dropped, by reason (duplicate, stale)."),
		metric.WithUnit("{message}")); err != nil {
		return nil, err
	}
	return t, nil
}

func sourceAttrs(k fence.Key) metric.MeasurementOption {
	return metric.WithAttributes(
		attribute.String("baton.group", k.Group),
		attribute.String("messaging.source.name", k.Topic),
		attribute.Int("messaging.source.partition.id", int(k.Partition)),
	)
}
