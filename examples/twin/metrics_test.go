package main

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestMetricsServeProcessSeries: a member's /metrics carries the Go runtime's, the process's
// and the build's series beside Baton's, and no otel_scope_* label.
func TestMetricsServeProcessSeries(t *testing.T) {
	mp, h, err := newMetrics("twin")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = mp.Shutdown(context.Background()) }()
	c, err := mp.Meter("github.com/batonhq/baton/consumer").Int64Counter("baton.consumer.claims")
	if err != nil {
		t.Fatal(err)
	}
	c.Add(context.Background(), 1)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{"\ngo_goroutines ", "\nprocess_start_time_seconds ", "\ngo_build_info{", "\nbaton_consumer_claims_total"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", strings.TrimSpace(want))
		}
	}
	if strings.Contains(body, "otel_scope_") {
		t.Errorf("/metrics carries otel_scope_* labels")
	}
}
