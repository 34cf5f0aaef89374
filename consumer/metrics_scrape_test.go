package consumer_test

import (
	"bufio"
	"context"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kfake"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/batonhq/baton/consumer"
)

// scrape returns the Prometheus text exposition of reg, one line a sample.
func scrape(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	var lines []string
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		if l := sc.Text(); l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	return lines
}

// histogramBuckets reads the cumulative bucket counts of one histogram series family from a
// scrape, summed over its series: le bound -> count, and the total count.
func histogramBuckets(t *testing.T, lines []string, name string) (map[float64]float64, float64) {
	t.Helper()
	buckets := map[float64]float64{}
	var total float64
	for _, l := range lines {
		sp := strings.LastIndexByte(l, ' ')
		v, err := strconv.ParseFloat(l[sp+1:], 64)
		if err != nil {
			t.Fatalf("scrape line %q: %v", l, err)
		}
		switch {
		case strings.HasPrefix(l, name+"_bucket{"):
			i := strings.Index(l, `le="`)
			le := l[i+4 : i+4+strings.IndexByte(l[i+4:], '"')]
			b, err := strconv.ParseFloat(le, 64)
			if err != nil {
				t.Fatalf("le %q in %q: %v", le, l, err)
			}
			buckets[b] += v
		case strings.HasPrefix(l, name+"_count"):
			total += v
		}
	}
	return buckets, total
}

// TestApplyDurationBucketsInSeconds scrapes the apply-duration histogram through the
// Prometheus exporter an operator mounts: its unit is seconds, so its buckets must be bounds
// in seconds. Batches applied in milliseconds must fall in sub-second buckets; with bounds
// meant for milliseconds (the SDK's default 0, 5, 10, 25 ... 10000) every one of them lands in
// le="5" and a p99 reads about five seconds.
func TestApplyDurationBucketsInSeconds(t *testing.T) {
	const topic = "timed"
	brokers := fakeKafka(t, kfake.SeedTopics(2, topic))
	produce(t, brokers, topic, 8, 5)
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	store := newStore(t)
	c, err := consumer.New("g", []string{topic}, store, nil, consumer.PerPartition(newFolder().factory),
		consumer.Kafka(fastKafka(brokers)...), consumer.Logger(quiet), consumer.MeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	m := start(t, c)
	waitFor(t, "every record applied", 30*time.Second, allApplied(store, 8, 5))
	if err := m.stop(); err != nil {
		t.Fatal(err)
	}

	const name = "baton_consumer_apply_duration_seconds"
	buckets, total := histogramBuckets(t, scrape(t, reg), name)
	if total == 0 {
		t.Fatalf("%s_count is 0 after every record was applied: nothing recorded", name)
	}
	for _, le := range []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60} {
		if _, ok := buckets[le]; !ok {
			t.Errorf("%s has no le=%q bucket: its bounds are not seconds (have %v)", name, strconv.FormatFloat(le, 'g', -1, 64), keys(buckets))
		}
	}
	// A batch on kfake and memfence takes milliseconds; allow a loaded machine a second.
	if got := buckets[1]; got != total {
		t.Errorf("%s: %v of %v batches at or below le=\"1\": millisecond batches are counted as seconds (buckets %v)", name, got, total, buckets)
	}
}

func keys(m map[float64]float64) []float64 {
	out := make([]float64, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
