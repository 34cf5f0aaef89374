package deploytest

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// root is the repository root, from this package's directory.
const root = "../.."

// instrument is one metric Baton records: its OpenTelemetry name, kind, unit and the attribute
// keys it is recorded with.
type instrument struct {
	pkg, name, kind, unit string
	attrs                 []string
}

var (
	partAttrs    = []string{"baton.group", "messaging.destination.name", "messaging.destination.partition.id"}
	outcomeAttrs = []string{"baton.group", "messaging.destination.name", "messaging.destination.partition.id", "baton.outcome"}
	sourceAttrs  = []string{"baton.group", "messaging.source.name", "messaging.source.partition.id"}
)

// batonInstruments is what consumer and outbox record (consumer/telemetry.go, health.go;
// outbox/telemetry.go, relay.go, inbox.go). TestInstrumentsMatchDocsAndSource keeps it honest
// against the doc.go lists and the instrument constructors in the source.
var batonInstruments = []instrument{
	{"consumer", "baton.consumer.records.applied", "counter", "", partAttrs},
	{"consumer", "baton.consumer.records.duplicates_skipped", "counter", "", partAttrs},
	{"consumer", "baton.consumer.stale_refusals", "counter", "", partAttrs},
	{"consumer", "baton.consumer.claims", "counter", "", partAttrs},
	{"consumer", "baton.consumer.claims.stale", "counter", "", partAttrs},
	{"consumer", "baton.consumer.regressions", "counter", "", partAttrs},
	{"consumer", "baton.consumer.recoveries", "counter", "", partAttrs},
	{"consumer", "baton.consumer.handovers", "counter", "", partAttrs},
	{"consumer", "baton.consumer.records.dead_lettered", "counter", "", partAttrs},
	{"consumer", "baton.consumer.rebalances", "counter", "", outcomeAttrs},
	{"consumer", "baton.consumer.retries", "counter", "", outcomeAttrs},
	{"consumer", "baton.consumer.client_errors", "counter", "", []string{"baton.group", "baton.error.kind"}},
	{"consumer", "baton.consumer.watchdog.stops", "counter", "", partAttrs},
	{"consumer", "baton.consumer.topic_refusals", "counter", "", outcomeAttrs},
	{"consumer", "baton.consumer.records.lost", "counter", "", partAttrs},
	{"consumer", "baton.consumer.apply.duration", "histogram", "s", outcomeAttrs},
	{"consumer", "baton.consumer.lag", "gauge", "", partAttrs},
	{"outbox", "baton.outbox.backlog", "gauge", "{message}", sourceAttrs},
	{"outbox", "baton.outbox.oldest_pending_age", "gauge", "s", sourceAttrs},
	{"outbox", "baton.outbox.delivered", "counter", "{message}", sourceAttrs},
	{"outbox", "baton.outbox.dead_lettered", "counter", "{message}", append(slices.Clip(sourceAttrs), "messaging.destination.name", "reason")},
	{"outbox", "baton.outbox.commit_to_ack", "histogram", "s", nil},
	{"outbox", "baton.inbox.admitted", "counter", "{message}", []string{"baton.inbox"}},
	{"outbox", "baton.inbox.drops", "counter", "{message}", []string{"baton.inbox", "reason"}},
}

// docMetrics returns the metric names listed in the "# Observability" section of pkg's doc.go.
// Names starting with "." continue the package's prefix (consumer/doc.go writes
// "baton.consumer.records.applied, .records.duplicates_skipped, ..."); a name after "by" is an
// attribute, not a metric.
func docMetrics(t *testing.T, pkg string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, pkg, "doc.go"))
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	for line := range strings.SplitSeq(string(b), "\n") {
		text.WriteString(strings.TrimPrefix(strings.TrimPrefix(line, "//"), " ") + " ")
	}
	s := text.String()
	start := strings.Index(s, "# Observability")
	if start < 0 {
		t.Fatalf("%s/doc.go has no # Observability section", pkg)
	}
	s = s[start:]
	if i := strings.Index(s, "Metrics ("); i >= 0 {
		s = s[i:]
	} else {
		t.Fatalf("%s/doc.go: no \"Metrics (\" in # Observability", pkg)
	}
	// The list ends where the doc turns to traces.
	if i := regexp.MustCompile(`One span|Append captures|package `).FindStringIndex(s); i != nil {
		s = s[:i[0]]
	}
	tok := regexp.MustCompile(`(by )?(baton(?:\.[a-z_]+)+|\.[a-z_]+(?:\.[a-z_]+)*)`)
	prefix := "baton." + pkg
	var names []string
	for _, m := range tok.FindAllStringSubmatch(s, -1) {
		if m[1] != "" {
			continue // an attribute: "(by baton.error.kind: ...)"
		}
		n := m[2]
		if strings.HasPrefix(n, ".") {
			n = prefix + n
		}
		names = append(names, n)
	}
	return names
}

// sourceInstruments returns name -> kind and unit of every instrument a package's non-test
// source creates with a literal "baton." name: m.Int64Counter("baton...", metric.WithUnit(u)),
// and consumer's counter(&dst, "baton...", desc) helper, which makes an Int64Counter without
// a unit.
func sourceInstruments(t *testing.T, pkg string) map[string][2]string {
	t.Helper()
	kinds := map[string]string{
		"Int64Counter": "counter", "Float64Counter": "counter", "Int64Histogram": "histogram",
		"Float64Histogram": "histogram", "Int64Gauge": "gauge", "Float64Gauge": "gauge",
		"Int64UpDownCounter": "updowncounter", "Float64UpDownCounter": "updowncounter",
		"Int64ObservableGauge": "gauge", "Float64ObservableGauge": "gauge",
		"Int64ObservableCounter": "counter", "Float64ObservableCounter": "counter",
	}
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(root, pkg, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	found := map[string][2]string{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			var kind string
			var nameArg ast.Expr
			switch fn := call.Fun.(type) {
			case *ast.SelectorExpr:
				if k, ok := kinds[fn.Sel.Name]; ok && len(call.Args) > 0 {
					kind, nameArg = k, call.Args[0]
				}
			case *ast.Ident:
				if fn.Name == "counter" && len(call.Args) > 1 {
					kind, nameArg = "counter", call.Args[1]
				}
			}
			lit, ok := nameArg.(*ast.BasicLit)
			if kind == "" || !ok || lit.Kind != token.STRING {
				return true
			}
			name, _ := strconv.Unquote(lit.Value)
			if !strings.HasPrefix(name, "baton.") {
				return true
			}
			unit := ""
			for _, a := range call.Args {
				opt, ok := a.(*ast.CallExpr)
				if !ok {
					continue
				}
				if sel, ok := opt.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "WithUnit" && len(opt.Args) == 1 {
					if u, ok := opt.Args[0].(*ast.BasicLit); ok {
						unit, _ = strconv.Unquote(u.Value)
					}
				}
			}
			found[name] = [2]string{kind, unit}
			return true
		})
	}
	return found
}

func TestInstrumentsMatchDocsAndSource(t *testing.T) {
	for _, pkg := range []string{"consumer", "outbox"} {
		want := map[string]instrument{}
		for _, in := range batonInstruments {
			if in.pkg == pkg {
				want[in.name] = in
			}
		}
		doc := docMetrics(t, pkg)
		if len(doc) == 0 {
			t.Fatalf("%s/doc.go lists no metrics", pkg)
		}
		for _, n := range doc {
			if _, ok := want[n]; !ok {
				t.Errorf("%s/doc.go lists %s, which the test's instrument table lacks", pkg, n)
			}
		}
		for n := range want {
			if !slices.Contains(doc, n) {
				t.Errorf("%s: %s is recorded but not listed in %s/doc.go", pkg, n, pkg)
			}
		}
		src := sourceInstruments(t, pkg)
		for n, in := range want {
			got, ok := src[n]
			switch {
			case !ok:
				t.Errorf("%s: no instrument named %s in the source", pkg, n)
			case got != [2]string{in.kind, in.unit}:
				t.Errorf("%s: %s is a %s with unit %q in the source, the table says %s with unit %q",
					pkg, n, got[0], got[1], in.kind, in.unit)
			}
		}
		for n := range src {
			if _, ok := want[n]; !ok {
				t.Errorf("%s: the source creates %s, which the test's table lacks", pkg, n)
			}
		}
		// Every attribute key the table names is one the package's source records.
		text := readSource(t, pkg)
		for _, in := range want {
			for _, a := range in.attrs {
				if !strings.Contains(text, strconv.Quote(a)) {
					t.Errorf("%s: attribute %q of %s does not occur in the source", pkg, a, in.name)
				}
			}
		}
	}
}

func readSource(t *testing.T, pkg string) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, pkg, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(data)
	}
	return b.String()
}

// series is one Prometheus series name and the labels it carries once scraped.
type series map[string][]string

// exportedSeries names Baton's instruments the way a scrape of the application sees them: it
// records each instrument once through the real OpenTelemetry Prometheus exporter (without the
// otel_scope_* labels, as every Baton program wires it) and gathers the registry. Histograms expand into
// _bucket (with le), _sum and _count; Prometheus adds job and instance when it scrapes.
func exportedSeries(t *testing.T) (series, map[string]string) {
	t.Helper()
	return seriesOf(t, batonInstruments)
}

// seriesOf is exportedSeries for the instruments ins.
func seriesOf(t *testing.T, ins []instrument) (series, map[string]string) {
	t.Helper()
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	ctx := context.Background()
	for _, in := range ins {
		m := mp.Meter("github.com/batonhq/baton/" + in.pkg)
		var kv []attribute.KeyValue
		for _, a := range in.attrs {
			kv = append(kv, attribute.String(a, "x"))
		}
		attrs := metric.WithAttributes(kv...)
		switch in.kind {
		case "counter":
			c, err := m.Int64Counter(in.name, metric.WithUnit(in.unit))
			if err != nil {
				t.Fatal(err)
			}
			c.Add(ctx, 1, attrs)
		case "histogram":
			h, err := m.Float64Histogram(in.name, metric.WithUnit(in.unit))
			if err != nil {
				t.Fatal(err)
			}
			h.Record(ctx, 0.5, attrs)
		case "gauge":
			g, err := m.Int64Gauge(in.name, metric.WithUnit(in.unit))
			if err != nil {
				t.Fatal(err)
			}
			g.Record(ctx, 1, attrs)
		default:
			t.Fatalf("%s: kind %s", in.name, in.kind)
		}
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := series{}
	from := map[string]string{} // series -> OpenTelemetry instrument
	for _, f := range fams {
		if !strings.HasPrefix(f.GetName(), "baton_") {
			continue // target_info
		}
		labels := map[string]bool{"job": true, "instance": true}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = true
			}
		}
		names := []string{f.GetName()}
		if f.GetType() == dto.MetricType_HISTOGRAM {
			names = []string{f.GetName() + "_bucket", f.GetName() + "_sum", f.GetName() + "_count"}
		}
		for _, n := range names {
			ls := slices.Sorted(maps.Keys(labels))
			if strings.HasSuffix(n, "_bucket") {
				ls = slices.Sorted(slices.Values(append(ls, "le")))
			}
			out[n] = ls
			from[n] = otelName(ins, f.GetName())
		}
	}
	if len(out) == 0 {
		t.Fatal("the exporter produced no baton_ series")
	}
	return out, from
}

// otelName finds the instrument a Prometheus family came from: the one whose name, dots as
// underscores, is the longest prefix of the family (claims_stale_total is claims.stale, not
// claims).
func otelName(ins []instrument, family string) string {
	best := ""
	for _, in := range ins {
		base := strings.ReplaceAll(in.name, ".", "_")
		if (family == base || strings.HasPrefix(family, base+"_")) && len(in.name) > len(best) {
			best = in.name
		}
	}
	return best
}

// TestExporterNames pins the mapping deploy/README.md documents ("Metrics"), so a change of
// the exporter's naming rules fails here rather than in somebody's dashboard.
func TestExporterNames(t *testing.T) {
	got, _ := exportedSeries(t)
	want := map[string]string{
		"baton.consumer.records.applied":            "baton_consumer_records_applied_total",
		"baton.consumer.records.duplicates_skipped": "baton_consumer_records_duplicates_skipped_total",
		"baton.consumer.stale_refusals":             "baton_consumer_stale_refusals_total",
		"baton.consumer.claims":                     "baton_consumer_claims_total",
		"baton.consumer.claims.stale":               "baton_consumer_claims_stale_total",
		"baton.consumer.regressions":                "baton_consumer_regressions_total",
		"baton.consumer.recoveries":                 "baton_consumer_recoveries_total",
		"baton.consumer.handovers":                  "baton_consumer_handovers_total",
		"baton.consumer.records.dead_lettered":      "baton_consumer_records_dead_lettered_total",
		"baton.consumer.rebalances":                 "baton_consumer_rebalances_total",
		"baton.consumer.retries":                    "baton_consumer_retries_total",
		"baton.consumer.client_errors":              "baton_consumer_client_errors_total",
		"baton.consumer.watchdog.stops":             "baton_consumer_watchdog_stops_total",
		"baton.consumer.topic_refusals":             "baton_consumer_topic_refusals_total",
		"baton.consumer.records.lost":               "baton_consumer_records_lost_total",
		"baton.consumer.apply.duration":             "baton_consumer_apply_duration_seconds_bucket",
		"baton.consumer.lag":                        "baton_consumer_lag",
		"baton.outbox.backlog":                      "baton_outbox_backlog",
		"baton.outbox.oldest_pending_age":           "baton_outbox_oldest_pending_age_seconds",
		"baton.outbox.delivered":                    "baton_outbox_delivered_total",
		"baton.outbox.dead_lettered":                "baton_outbox_dead_lettered_total",
		"baton.outbox.commit_to_ack":                "baton_outbox_commit_to_ack_seconds_bucket",
		"baton.inbox.admitted":                      "baton_inbox_admitted_total",
		"baton.inbox.drops":                         "baton_inbox_drops_total",
	}
	if len(want) != len(batonInstruments) {
		t.Fatalf("the mapping covers %d instruments, Baton has %d", len(want), len(batonInstruments))
	}
	for otel, prom := range want {
		if _, ok := got[prom]; !ok {
			t.Errorf("%s: exporter series %s not found; got %v", otel, prom, slices.Sorted(maps.Keys(got)))
		}
	}
	// The readme's table is this mapping.
	readme := readFile(t, "deploy/README.md")
	for otel, prom := range want {
		prom = strings.TrimSuffix(prom, "_bucket")
		if !strings.Contains(readme, "| `"+otel+"` | `"+prom+"`") {
			t.Errorf("deploy/README.md does not map `%s` to `%s`", otel, prom)
		}
	}
	if ls := got["baton_consumer_lag"]; !slices.Contains(ls, "messaging_destination_partition_id") || slices.Contains(ls, "otel_scope_name") {
		t.Errorf("baton_consumer_lag labels %v: want the attributes with dots as underscores, and no otel_scope_name", ls)
	}
}

// TestOTelVersionMatchesBaton: the exporter that names the series here is built on the
// OpenTelemetry release Baton's go.mod requires, so an application linking Baton names them
// the same way.
func TestOTelVersionMatchesBaton(t *testing.T) {
	re := regexp.MustCompile(`(?m)^\s*go\.opentelemetry\.io/otel (v\S+)`)
	ours, baton := re.FindStringSubmatch(readFile(t, "internal/deploytest/go.mod")), re.FindStringSubmatch(readFile(t, "go.mod"))
	if ours == nil || baton == nil || ours[1] != baton[1] {
		t.Errorf("go.opentelemetry.io/otel: this module has %v, Baton's go.mod %v", ours, baton)
	}
}

func readFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
