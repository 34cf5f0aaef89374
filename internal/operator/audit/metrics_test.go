package audit_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/batonhq/baton/internal/operator/audit"
)

// Each violation is counted once in baton.audit.violations with its check, group, topic and
// partition, however many passes still see it; each pass counts its statements.
func TestViolationsCountedOnce(t *testing.T) {
	e := sqliteEnv(t)
	e.produce(t, 10)
	e.claim(t, tok5)
	e.apply(t, tok5, 0, 2)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	a, _ := e.auditor(t, func(c *audit.Config) { c.Meter = mp })
	clean(t, a, "applied 0..2")
	commit(t, e, 9)
	within(t, e, a, audit.Skipped, "committed offset ahead")
	pass(t, a) // still there: not counted again

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	sums := map[string]metricdata.Sum[int64]{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if s, ok := m.Data.(metricdata.Sum[int64]); ok {
				sums[m.Name] = s
			}
		}
	}
	v := sums["baton.audit.violations"]
	if len(v.DataPoints) != 1 || v.DataPoints[0].Value != 1 {
		t.Fatalf("baton.audit.violations = %+v, want one point of 1", v.DataPoints)
	}
	want := attribute.NewSet(attribute.String("check", "skipped"), attribute.String("group", e.group),
		attribute.String("topic", e.src), attribute.Int("partition", 0))
	if got := v.DataPoints[0].Attributes; !got.Equals(&want) {
		t.Errorf("attributes %v, want %v", got.ToSlice(), want.ToSlice())
	}
	if q := sums["baton.audit.queries"]; len(q.DataPoints) != 1 || q.DataPoints[0].Value == 0 {
		t.Errorf("baton.audit.queries = %+v, want the statements counted", q.DataPoints)
	}
}
