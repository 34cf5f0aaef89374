package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// TestHandlerServesProcessSeries: /metrics carries the Go runtime's, the process's and the
// build's series beside Baton's, and no otel_scope_* label.
func TestHandlerServesProcessSeries(t *testing.T) {
	m, err := New(context.Background(), ServiceName("test"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Shutdown(context.Background()) }()
	c, err := m.Provider().Meter("github.com/batonhq/baton/test").Int64Counter("baton.test.things")
	if err != nil {
		t.Fatal(err)
	}
	c.Add(context.Background(), 1)
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{"\ngo_goroutines ", "\ngo_gc_duration_seconds", "\nprocess_start_time_seconds ", "\nprocess_resident_memory_bytes ", "\ngo_build_info{", "\nbaton_test_things_total"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", strings.TrimSpace(want))
		}
	}
	if strings.Contains(body, "otel_scope_") {
		t.Errorf("/metrics carries otel_scope_* labels:\n%s", body)
	}
}

// TestOTLPProtocol: the protocol comes from the per-signal variable, else the general one,
// else http/protobuf; anything else is refused by name.
func TestOTLPProtocol(t *testing.T) {
	for _, c := range []struct{ signal, general, want, err string }{
		{"", "", "http/protobuf", ""},
		{"", "grpc", "grpc", ""},
		{"http/protobuf", "grpc", "http/protobuf", ""},
		{"", "http/json", "", "OTEL_EXPORTER_OTLP_PROTOCOL=http/json"},
		{"thrift", "", "", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL=thrift"},
	} {
		t.Setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", c.signal)
		t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", c.general)
		got, err := OTLPProtocol("METRICS")
		if got != c.want || (err == nil) != (c.err == "") || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%+v: %q, %v", c, got, err)
		}
	}
	// New builds the exporter the protocol names (neither connects before its first push).
	t.Setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	for _, p := range []string{"grpc", "http/protobuf"} {
		t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", p)
		var c config
		if err := OTLPFromEnv()(&c); err != nil || !c.otlp || c.grpc != (p == "grpc") {
			t.Errorf("%s: otlp %v grpc %v err %v", p, c.otlp, c.grpc, err)
		}
	}
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
	if _, err := New(context.Background(), OTLPFromEnv()); err == nil {
		t.Error("New accepted OTEL_EXPORTER_OTLP_PROTOCOL=http/json")
	}
}

// TestNewLogger: text and json at the level asked for; anything else is refused.
func TestNewLogger(t *testing.T) {
	var b bytes.Buffer
	l, err := NewLogger(&b, "json", "warn")
	if err != nil {
		t.Fatal(err)
	}
	l.Info("hidden")
	l.Warn("shown", "k", 1)
	var rec map[string]any
	if err := json.Unmarshal(b.Bytes(), &rec); err != nil || rec["msg"] != "shown" || rec["level"] != "WARN" {
		t.Errorf("json at warn wrote %q (%v)", b.String(), err)
	}
	b.Reset()
	if l, err = NewLogger(&b, "", ""); err != nil {
		t.Fatal(err)
	}
	l.Info("hello")
	if !strings.HasPrefix(b.String(), "time=") || !strings.Contains(b.String(), "level=INFO msg=hello") {
		t.Errorf("the default logger wrote %q, want text at info", b.String())
	}
	for _, bad := range [][2]string{{"xml", "info"}, {"text", "loud"}} {
		if _, err := NewLogger(&b, bad[0], bad[1]); err == nil {
			t.Errorf("NewLogger(%q, %q) accepted", bad[0], bad[1])
		}
	}
}

// TestHandlerServesExemplars: a scraper that asks for OpenMetrics gets a histogram's exemplars
// with the trace id of the span its value was recorded under (Prometheus stores them with
// --enable-feature=exemplar-storage; Grafana links a slow bucket to the trace).
func TestHandlerServesExemplars(t *testing.T) {
	m, err := New(context.Background(), ServiceName("test"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Shutdown(context.Background()) }()
	h, err := m.Provider().Meter("github.com/batonhq/baton/test").Float64Histogram("baton.test.duration", metric.WithUnit("s"))
	if err != nil {
		t.Fatal(err)
	}
	tid := trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8}, TraceFlags: trace.FlagsSampled})
	h.Record(trace.ContextWithSpanContext(context.Background(), sc), 0.003)
	req := httptest.NewRequest("GET", "/metrics", nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, req)
	if body := rec.Body.String(); !strings.Contains(body, `trace_id="`+tid.String()+`"`) {
		t.Errorf("/metrics in OpenMetrics has no exemplar with trace id %s:\n%s", tid, grepLines(body, "baton_test_duration"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
