package consumer

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
)

// BenchmarkProducerLinks measures the links of a batch of 1000 records with two headers each
// and no producer span among them, with the global propagator (no-op unless one is set) and
// with W3C trace context. Read its allocs/op.
//
//	go test -run '^$' -bench ProducerLinks -benchmem ./consumer/
func BenchmarkProducerLinks(b *testing.B) {
	recs := make([]*kgo.Record, 1000)
	for i := range recs {
		recs[i] = &kgo.Record{Headers: []kgo.RecordHeader{{Key: "id", Value: []byte("x")}, {Key: "key", Value: []byte("k")}}}
	}
	for name, p := range map[string]propagation.TextMapPropagator{"global": otel.GetTextMapPropagator(), "tracecontext": propagation.TraceContext{}} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if l := producerLinks(p, recs); len(l) != 0 {
					b.Fatalf("%d links", len(l))
				}
			}
		})
	}
}
