package consumer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
)

// Producers instrumented with franz-go's kotel plugin put the trace context of their "send"
// spans into the records' headers; the consumer's batch span links to exactly those spans, so a
// trace runs from the producer through Baton's fenced apply without any Baton code on the
// producing side.
func TestKotelProducerSpansLinked(t *testing.T) {
	const topic = "kotel"
	brokers := fakeKafka(t, kfake.SeedTopics(1, topic))
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	prop := propagation.TraceContext{}
	ctx := context.Background()

	k := kotel.NewKotel(kotel.WithTracer(kotel.NewTracer(kotel.TracerProvider(tp), kotel.TracerPropagator(prop))))
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.WithHooks(k.Hooks()...))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	parent, root := tp.Tracer("app").Start(ctx, "state change")
	const n = 5
	for i := 0; i < n; i++ {
		r := &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte{byte(i)}, Context: parent}
		if err := prod.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	root.End()
	sends := map[trace.SpanID]bool{}
	for _, s := range rec.Ended() {
		if s.SpanKind() == trace.SpanKindProducer && s.Parent().SpanID() == root.SpanContext().SpanID() {
			sends[s.SpanContext().SpanID()] = true
		}
	}
	if len(sends) != n {
		t.Fatalf("kotel recorded %d producer spans under the app span, want %d", len(sends), n)
	}

	store, err := memfence.New()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	applied := 0
	c, err := consumer.New("g", []string{topic}, fence.Sink[*memfence.Tx](store),
		nil, consumer.PerPartition(func(context.Context, fence.Key, fence.Token) (consumer.Handler[*memfence.Tx], error) {
			return consumer.Handler[*memfence.Tx](func(_ context.Context, _ *memfence.Tx, b *consumer.Batch) error {
				mu.Lock()
				applied += len(b.Records)
				mu.Unlock()
				return nil
			}), nil
		}),
		consumer.Kafka(fastKafka(brokers)...), consumer.Logger(quiet),
		consumer.TracerProvider(tp), consumer.TextMapPropagator(prop))
	if err != nil {
		t.Fatal(err)
	}
	m := start(t, c)
	waitFor(t, "records applied", 30*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return applied == n })
	if err := m.stop(); err != nil {
		t.Fatal(err)
	}
	linked := map[trace.SpanID]bool{}
	batches := 0
	for _, s := range rec.Ended() {
		if s.SpanKind() != trace.SpanKindConsumer {
			continue
		}
		batches++
		for _, l := range s.Links() {
			if l.SpanContext.TraceID() != root.SpanContext().TraceID() {
				t.Errorf("batch span links to trace %s, want the producer's %s", l.SpanContext.TraceID(), root.SpanContext().TraceID())
			}
			linked[l.SpanContext.SpanID()] = true
		}
	}
	if batches == 0 {
		t.Fatal("no batch span recorded")
	}
	for id := range sends {
		if !linked[id] {
			t.Errorf("kotel send span %s is not linked from any batch span", id)
		}
	}
}
