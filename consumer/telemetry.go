package consumer

import (
	"context"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/batonhq/baton/partition"
)

const instrumentation = "github.com/batonhq/baton/consumer"

type meters struct {
	applied, duplicates, stale, claims, regressions, recoveries metric.Int64Counter
	deadLettered, rebalances, retries, staleClaims              metric.Int64Counter
	clientErrors, topicRefusals, lost, handovers, stops         metric.Int64Counter
	applyLatency                                                metric.Float64Histogram
	lag                                                         metric.Int64ObservableGauge
	meter                                                       metric.Meter // for Run's lag callback
	group                                                       attribute.KeyValue
}

// applyBounds are the apply-duration histogram's bucket bounds, in seconds as its unit: from a
// millisecond batch on a local database to a minute-long one stalled on retries. (The SDK's
// default bounds, 0, 5, 10 ... 10000, are meant for milliseconds.)
var applyBounds = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// groupAttr is the attribute every consumer series carries: the consumer group, named as the
// outbox's series name it, so that both join on it.
const groupAttr = "baton.group"

func newMeters(p metric.MeterProvider, group string) (*meters, error) {
	m := p.Meter(instrumentation)
	var (
		ms  = meters{meter: m, group: attribute.String(groupAttr, group)}
		err error
	)
	counter := func(dst *metric.Int64Counter, name, desc string) {
		if err != nil {
			return
		}
		*dst, err = m.Int64Counter(name, metric.WithDescription(desc))
	}
	counter(&ms.applied, "baton.consumer.records.applied", "records applied to the sink")
	counter(&ms.duplicates, "baton.consumer.records.duplicates_skipped", "records skipped because the sink had already applied them")
	counter(&ms.stale, "baton.consumer.stale_refusals", "batches or claims refused by the fence because this member's token was stale")
	counter(&ms.staleClaims, "baton.consumer.claims.stale", "claims refused as stale (the partition stays unprocessed unless a regression is recovered)")
	counter(&ms.claims, "baton.consumer.claims", "successful fence claims on assignment")
	counter(&ms.regressions, "baton.consumer.regressions", "epoch regressions detected (current owner presenting a lower token)")
	counter(&ms.recoveries, "baton.consumer.recoveries", "epoch regressions recovered through Sink.Recover")
	counter(&ms.handovers, "baton.consumer.handovers", "partitions handed over at the same generation by this member's previous worker (a static member replaced, a KIP-848 member rejoined in place): verified, moved to a new era, not a regression")
	counter(&ms.deadLettered, "baton.consumer.records.dead_lettered", "poison records sent to the dead-letter topic")
	counter(&ms.rebalances, "baton.consumer.rebalances", "partition assignment changes seen (assigned, revoked, lost)")
	counter(&ms.retries, "baton.consumer.retries", "transient failures retried (a partition stalled on them)")
	counter(&ms.topicRefusals, "baton.consumer.topic_refusals", "partitions held because their topic was recreated or grown (baton.outcome recreated or grown) until an operator resets or acknowledges it")
	counter(&ms.lost, "baton.consumer.records.lost", "records deleted from the log (retention, truncation) before they were applied: data loss")
	counter(&ms.clientErrors, "baton.consumer.client_errors", "Kafka client failures: connect (dial, TLS, SASL), group (coordinator, join, sync), fetch")
	counter(&ms.stops, "baton.consumer.watchdog.stops", "partitions stopped because this member's group session expired while it could not reach the coordinator")
	if err != nil {
		return nil, err
	}
	if ms.applyLatency, err = m.Float64Histogram("baton.consumer.apply.duration", metric.WithUnit("s"),
		metric.WithDescription("time to apply one batch in one fenced transaction"),
		metric.WithExplicitBucketBoundaries(applyBounds...)); err != nil {
		return nil, err
	}
	if ms.lag, err = m.Int64ObservableGauge("baton.consumer.lag", metric.WithDescription(
		"records of a partition this member owns that the sink has not applied: the partition's high watermark minus the next offset to apply (the sink's position + 1)")); err != nil {
		return nil, err
	}
	return &ms, nil
}

// Outcomes known in advance, whose series start at 0 (zeroPartition, zeroRun) so that an
// increase() sees their first event.
var (
	rebalanceOutcomes = []string{"assigned", "revoked", "lost"}
	retryOutcomes     = []string{"apply", "load", "claim", "verify", "recover", "recover-conflict", "dead-letter", "after-commit"}
	refusalOutcomes   = []string{"recreated", "grown"}
	clientErrorKinds  = []string{"connect", "group", "fetch", "topic"}
)

// zeroPartition starts the series of partition id at 0: every per-partition counter, and
// those of its outcomes known in advance.
func (m *meters) zeroPartition(ctx context.Context, id partition.ID, lanes bool) {
	for _, c := range []metric.Int64Counter{m.applied, m.duplicates, m.stale, m.staleClaims, m.claims, m.regressions,
		m.recoveries, m.handovers, m.deadLettered, m.lost, m.stops} {
		c.Add(ctx, 0, m.part(id))
	}
	for _, o := range rebalanceOutcomes {
		m.rebalances.Add(ctx, 0, m.outcome(id, o))
	}
	for _, o := range retryOutcomes {
		m.retries.Add(ctx, 0, m.outcome(id, o))
	}
	if lanes {
		m.retries.Add(ctx, 0, m.outcome(id, "prepare"))
	}
	for _, o := range refusalOutcomes {
		m.topicRefusals.Add(ctx, 0, m.outcome(id, o))
	}
}

// zeroRun starts the client error series at 0.
func (m *meters) zeroRun(ctx context.Context) {
	for _, k := range clientErrorKinds {
		m.clientErrors.Add(ctx, 0, m.kind(k))
	}
}

// part is the attributes of a partition's series.
func (m *meters) part(id partition.ID) metric.MeasurementOption {
	return metric.WithAttributes(m.group, attribute.String("messaging.destination.name", id.Topic),
		attribute.Int("messaging.destination.partition.id", int(id.Partition)))
}

// outcome is the attributes of a partition's series for one outcome.
func (m *meters) outcome(id partition.ID, outcome string) metric.MeasurementOption {
	return metric.WithAttributes(m.group, attribute.String("messaging.destination.name", id.Topic),
		attribute.Int("messaging.destination.partition.id", int(id.Partition)),
		attribute.String("baton.outcome", outcome))
}

// kind is the attributes of a client error series.
func (m *meters) kind(kind string) metric.MeasurementOption {
	return metric.WithAttributes(m.group, attribute.String("baton.error.kind", kind))
}

// headerCarrier adapts record headers to the propagator, as kotel does.
type headerCarrier struct{ r *kgo.Record }

func (c headerCarrier) Get(key string) string {
	for _, h := range c.r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func (c headerCarrier) Set(key, value string) {
	for i, h := range c.r.Headers {
		if h.Key == key {
			c.r.Headers[i].Value = []byte(value)
			return
		}
	}
	c.r.Headers = append(c.r.Headers, kgo.RecordHeader{Key: key, Value: []byte(value)})
}

func (c headerCarrier) Keys() []string {
	out := make([]string, len(c.r.Headers))
	for i, h := range c.r.Headers {
		out[i] = h.Key
	}
	return out
}

var _ propagation.TextMapCarrier = headerCarrier{}

// producerLinks returns one link per distinct producer span found in the records' headers.
// A propagator that reads no header (no fields: the global one while none is set) finds none,
// so the records are not looked at.
func producerLinks(p propagation.TextMapPropagator, recs []*kgo.Record) []trace.Link {
	if len(p.Fields()) == 0 {
		return nil
	}
	var links []trace.Link
	seen := map[trace.SpanID]bool{}
	for _, r := range recs {
		if len(r.Headers) == 0 {
			continue
		}
		sc := trace.SpanContextFromContext(p.Extract(context.Background(), headerCarrier{r}))
		if !sc.IsValid() || seen[sc.SpanID()] {
			continue
		}
		seen[sc.SpanID()] = true
		links = append(links, trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{
			attribute.Int64("messaging.kafka.offset", r.Offset)}})
	}
	return links
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }
