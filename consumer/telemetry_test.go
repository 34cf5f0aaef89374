package consumer_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// call is one Handle call as the handler saw it.
type call struct {
	partition   int32
	token       string
	first, last int64
	failed      bool
}

// Records carrying a W3C traceparent from producer spans are consumed with the OpenTelemetry
// SDK behind the consumer's options: every Apply attempt is one span with topic, partition,
// token, offsets and outcome, linked to exactly the producer spans of its records; the
// records-applied, claims and retries counters and the apply-duration histogram match what
// happened. Batches are split at MaxInflightPerPartition even when one fetch brings more.
func TestTelemetrySpansLinksAndMetrics(t *testing.T) {
	const (
		topic      = "traced"
		partitions = 2
		spansPer   = 3 // producer spans per partition
		recsPer    = 3 // records per producer span
		perBatch   = 4 // MaxInflightPerPartition: a fetch of 10 records is applied as 4+4+2
	)
	brokers := fakeKafka(t, kfake.SeedTopics(partitions, topic))
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	prop := propagation.TraceContext{}
	ctx := context.Background()

	// Produce: per partition, three producer spans of three records each, then one record
	// without trace headers. producers maps partition/offset to the producer span.
	producers := map[string]trace.SpanContext{}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	produced := 0
	for p := int32(0); p < partitions; p++ {
		for s := 0; s < spansPer; s++ {
			sctx, span := tp.Tracer("producer").Start(ctx, "produce", trace.WithSpanKind(trace.SpanKindProducer))
			carrier := propagation.MapCarrier{}
			prop.Inject(sctx, carrier)
			var recs []*kgo.Record
			for i := 0; i < recsPer; i++ {
				r := &kgo.Record{Partition: p, Value: []byte(fmt.Sprintf("p%d-s%d-%d", p, s, i))}
				for k, v := range carrier {
					r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
				}
				recs = append(recs, r)
			}
			if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
				t.Fatal(err)
			}
			span.End()
			for _, r := range recs {
				producers[offsetKey(p, r.Offset)] = span.SpanContext()
			}
			produced += len(recs)
		}
		if err := cl.ProduceSync(ctx, &kgo.Record{Partition: p, Value: []byte("untraced")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		produced++
	}
	lastOffset := int64(produced/partitions - 1)

	// The handler records every call; the first call of partition 0 fails transiently, so
	// that one span carries the error outcome and the batch is retried.
	var (
		mu      sync.Mutex
		calls   []call
		failed0 bool
	)
	factory := func(context.Context, fence.Key, fence.Token) (consumer.Handler[*memfence.Tx], error) {
		return consumer.Handler[*memfence.Tx](func(ctx context.Context, tx *memfence.Tx, b *consumer.Batch) error {
			mu.Lock()
			defer mu.Unlock()
			c := call{partition: b.Key.Partition, token: b.Token.String(),
				first: b.Records[0].Offset, last: b.Records[len(b.Records)-1].Offset}
			if c.partition == 0 && !failed0 {
				failed0, c.failed = true, true
				calls = append(calls, c)
				return errTransient
			}
			calls = append(calls, c)
			return tx.Put("last/"+b.Key.String(), []byte(itoa(c.last)))
		}), nil
	}
	store := newStore(t)
	m := newMeter()
	c, err := consumer.New("g", []string{topic}, store, nil, consumer.PerPartition(factory), consumer.Kafka(fastKafka(brokers)...),
		consumer.Logger(quiet), consumer.MeterProvider(m), consumer.TracerProvider(tp),
		consumer.TextMapPropagator(prop), consumer.RetryBackoff(10*time.Millisecond, 50*time.Millisecond),
		consumer.MaxInflightPerPartition(perBatch), consumer.MaxInflight(2*perBatch))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	waitFor(t, "every record applied", 30*time.Second, func() bool {
		for p := int32(0); p < partitions; p++ {
			st, err := store.Load(ctx, fence.Key{Group: "g", Topic: topic, Partition: p})
			if err != nil || st.Position < lastOffset {
				return false
			}
		}
		return true
	})
	if err := mb.stop(); err != nil { // Run returns after every batch span has ended
		t.Fatal(err)
	}

	var spans []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "baton.apply "+topic {
			spans = append(spans, s)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(spans) != len(calls) {
		t.Fatalf("%d batch spans for %d handler calls: want one span per batch attempt", len(spans), len(calls))
	}
	applied := map[string]int{} // partition/offset -> times covered by an applied span
	var appliedSpans, errorSpans int
	for _, s := range spans {
		a := attrs(s.Attributes())
		p, first, last := int32(a.int(t, "messaging.destination.partition.id")), a.int(t, "baton.first_offset"), a.int(t, "baton.last_offset")
		where := fmt.Sprintf("span of partition %d offsets %d..%d", p, first, last)
		if got := a.str(t, "messaging.destination.name"); got != topic {
			t.Errorf("%s: topic %q, want %q", where, got, topic)
		}
		if s.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("%s: kind %v, want consumer", where, s.SpanKind())
		}
		if n := a.int(t, "messaging.batch.message_count"); n != last-first+1 || n > perBatch {
			t.Errorf("%s: message count %d, want %d and at most %d (MaxInflightPerPartition)", where, n, last-first+1, perBatch)
		}
		// The span matches exactly one handler call: same partition, offsets and token, and
		// the outcome of that call.
		i := slices.IndexFunc(calls, func(c call) bool { return c.partition == p && c.first == first && c.last == last })
		if i < 0 {
			t.Errorf("%s: no handler call applied these records", where)
			continue
		}
		hc := calls[i]
		calls = slices.Delete(calls, i, i+1)
		if got := a.str(t, "baton.token"); got != hc.token {
			t.Errorf("%s: token %q, the handler's batch had %q", where, got, hc.token)
		}
		switch outcome := a.str(t, "baton.outcome"); {
		case hc.failed && outcome == "error" && s.Status().Code == codes.Error:
			errorSpans++
		case !hc.failed && outcome == "applied" && s.Status().Code != codes.Error:
			appliedSpans++
			for o := first; o <= last; o++ {
				applied[offsetKey(p, o)]++
			}
		default:
			t.Errorf("%s: outcome %q status %v, but the handler call failed=%v", where, outcome, s.Status().Code, hc.failed)
		}
		// Links: exactly the distinct producer spans of the batch's records, as remote span
		// contexts equal to the producers' (trace id, span id, flags).
		want := map[string]bool{}
		for o := first; o <= last; o++ {
			if sc, ok := producers[offsetKey(p, o)]; ok {
				want[linkKey(sc.WithRemote(true))] = true
			}
		}
		got := map[string]bool{}
		for _, l := range s.Links() {
			k := linkKey(l.SpanContext)
			if got[k] {
				t.Errorf("%s: %s linked twice", where, k)
			}
			got[k] = true
		}
		if len(got) != len(want) {
			t.Errorf("%s: %d links, want %d (one per distinct producer span of its records)", where, len(got), len(want))
		}
		for k := range want {
			if !got[k] {
				t.Errorf("%s: no link to producer span %s", where, k)
			}
		}
	}
	t.Logf("%d batch spans (%d applied, %d failed), %d records", len(spans), appliedSpans, errorSpans, produced)
	if errorSpans != 1 {
		t.Errorf("%d spans with outcome error, want 1 (the transient failure)", errorSpans)
	}
	for p := int32(0); p < partitions; p++ {
		for o := int64(0); o <= lastOffset; o++ {
			if n := applied[offsetKey(p, o)]; n != 1 {
				t.Errorf("partition %d offset %d covered by %d applied spans, want 1", p, o, n)
			}
		}
	}

	// Metrics.
	rm := m.collect(t)
	perPartition := map[int64]int64{}
	for _, dp := range sumPoints(rm, "baton.consumer.records.applied") {
		if topicOf(dp.Attributes) != topic {
			t.Errorf("records.applied point without the topic attribute: %v", dp.Attributes.ToSlice())
		}
		v, _ := dp.Attributes.Value("messaging.destination.partition.id")
		perPartition[v.AsInt64()] += dp.Value
	}
	for p := int64(0); p < partitions; p++ {
		if perPartition[p] != lastOffset+1 {
			t.Errorf("records.applied for partition %d: %d, want %d", p, perPartition[p], lastOffset+1)
		}
	}
	if got := m.sum(t, "baton.consumer.claims"); got != partitions {
		t.Errorf("claims %d, want %d (one per partition, one member)", got, partitions)
	}
	if got := m.sum(t, "baton.consumer.retries"); got != 1 {
		t.Errorf("retries %d, want 1", got)
	}
	// Each apply-duration point carries exemplars naming the trace of a batch span, so a slow
	// bucket leads to the batch's trace.
	traces := map[trace.TraceID]bool{}
	for _, s := range spans {
		traces[s.SpanContext().TraceID()] = true
	}
	var histCount uint64
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if h, ok := mt.Data.(metricdata.Histogram[float64]); ok && mt.Name == "baton.consumer.apply.duration" {
				for _, dp := range h.DataPoints {
					histCount += dp.Count
					if dp.Count > 0 && len(dp.Exemplars) == 0 {
						t.Errorf("apply.duration point %v has no exemplar", dp.Attributes.ToSlice())
					}
					for _, ex := range dp.Exemplars {
						if !traces[trace.TraceID(ex.TraceID)] {
							t.Errorf("apply.duration exemplar with trace %x, not a batch span's", ex.TraceID)
						}
					}
				}
			}
		}
	}
	if histCount != uint64(appliedSpans+errorSpans) {
		t.Errorf("apply.duration recorded %d batches, want %d (one per batch span)", histCount, appliedSpans+errorSpans)
	}
}

func offsetKey(p int32, o int64) string { return strconv.Itoa(int(p)) + "/" + itoa(o) }

// linkKey identifies a span context by everything a propagated one carries.
func linkKey(sc trace.SpanContext) string {
	return fmt.Sprintf("trace %s span %s flags %s remote %v", sc.TraceID(), sc.SpanID(), sc.TraceFlags(), sc.IsRemote())
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

// attrs reads span attributes by name; a missing or mistyped one fails the test.
type attrs []attribute.KeyValue

func (as attrs) get(t *testing.T, k string) attribute.Value {
	t.Helper()
	for _, a := range as {
		if string(a.Key) == k {
			return a.Value
		}
	}
	t.Fatalf("span attribute %s missing (have %v)", k, []attribute.KeyValue(as))
	return attribute.Value{}
}

func (as attrs) str(t *testing.T, k string) string {
	t.Helper()
	v := as.get(t, k)
	if v.Type() != attribute.STRING {
		t.Fatalf("span attribute %s is %v, want a string", k, v.Type())
	}
	return v.AsString()
}

func (as attrs) int(t *testing.T, k string) int64 {
	t.Helper()
	v := as.get(t, k)
	if v.Type() != attribute.INT64 {
		t.Fatalf("span attribute %s is %v, want an integer", k, v.Type())
	}
	return v.AsInt64()
}

func (m *meter) collect(t *testing.T) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := m.r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	return rm
}

func sumPoints(rm metricdata.ResourceMetrics, name string) []metricdata.DataPoint[int64] {
	var out []metricdata.DataPoint[int64]
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if s, ok := mt.Data.(metricdata.Sum[int64]); ok && mt.Name == name {
				out = append(out, s.DataPoints...)
			}
		}
	}
	return out
}

func topicOf(s attribute.Set) string {
	v, _ := s.Value("messaging.destination.name")
	return v.AsString()
}
