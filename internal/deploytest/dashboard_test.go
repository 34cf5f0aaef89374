package deploytest

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
)

const dashboardFile = "deploy/compose/grafana/dashboards/baton.json"

// query is one PromQL expression of the dashboard, with where it sits.
type query struct {
	where, expr, legend string
}

// dashboardQueries returns every PromQL expression in the dashboard: the panels' targets
// (rows' nested panels included) and the query variables.
func dashboardQueries(t *testing.T, data []byte) []query {
	t.Helper()
	var d struct {
		UID        string     `json:"uid"`
		Panels     []panel    `json:"panels"`
		Templating templating `json:"templating"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var qs []query
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				qs = append(qs, query{fmt.Sprintf("panel %q target %s", p.Title, tg.RefID), tg.Expr, tg.LegendFormat})
			}
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q queries nothing", p.Title)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			qs = append(qs, query{fmt.Sprintf("variable %q", v.Name), v.Definition, ""})
		}
	}
	return qs
}

type panel struct {
	Title   string   `json:"title"`
	Type    string   `json:"type"`
	Panels  []panel  `json:"panels"`
	Targets []target `json:"targets"`
}

type target struct {
	RefID        string `json:"refId"`
	Expr         string `json:"expr"`
	LegendFormat string `json:"legendFormat"`
}

type templating struct {
	List []struct {
		Name       string `json:"name"`
		Type       string `json:"type"`
		Definition string `json:"definition"`
	} `json:"list"`
}

// parsed is what a PromQL expression references: series names, and labels in matchers,
// groupings and vector matchings.
type parsed struct {
	metrics, labels []string
}

var (
	// labelVals is Grafana's label_values(metric, label) variable query (not PromQL).
	labelVals = regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$`)
	// grafanaVars are Grafana's interval variables, which only occur as range durations.
	grafanaVars = strings.NewReplacer("$__rate_interval", "1m", "$__interval", "1m", "$__range", "1h")
)

// parsePromQL parses expr with Prometheus's own PromQL parser (after replacing Grafana's
// interval variables; other variables sit inside label-value strings) and returns what it
// references.
func parsePromQL(expr string) (parsed, error) {
	var p parsed
	expr = strings.TrimSpace(expr)
	if m := labelVals.FindStringSubmatch(expr); m != nil {
		return parsed{metrics: []string{m[1]}, labels: []string{m[2]}}, nil
	}
	e, err := parser.NewParser(parser.Options{}).ParseExpr(grafanaVars.Replace(expr))
	if err != nil {
		return p, err
	}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			p.metrics = append(p.metrics, n.Name) // "" for a selector without a name
			for _, m := range n.LabelMatchers {
				if m.Name != "__name__" {
					p.labels = append(p.labels, m.Name)
				}
			}
		case *parser.AggregateExpr:
			p.labels = append(p.labels, n.Grouping...)
		case *parser.BinaryExpr:
			if n.VectorMatching != nil {
				p.labels = append(p.labels, n.VectorMatching.MatchingLabels...)
				p.labels = append(p.labels, n.VectorMatching.Include...)
			}
		}
		return nil
	})
	return p, nil
}

func TestPromQLParse(t *testing.T) {
	p, err := parsePromQL(`histogram_quantile(0.99, sum by (le, x) (rate(a_b_bucket{c=~"$t", d!="}"}[$__rate_interval])))`)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.metrics, []string{"a_b_bucket"}) || !slices.Equal(slices.Sorted(slices.Values(p.labels)), []string{"c", "d", "le", "x"}) {
		t.Errorf("got %+v", p)
	}
	for _, bad := range []string{`rat(x[5m])`, `sum by (a (x)`, `rate(x)`} {
		if _, err := parsePromQL(bad); err == nil {
			t.Errorf("%s parsed", bad)
		}
	}
	if p, _ := parsePromQL(`label_values(m_total, lbl)`); !slices.Equal(p.metrics, []string{"m_total"}) || !slices.Equal(p.labels, []string{"lbl"}) {
		t.Errorf("label_values: %+v", p)
	}
}

var legendLabel = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)

// checkQuery returns what is wrong with q: a series Baton does not emit, a label (in a
// matcher, a grouping or the legend) those series do not carry. It also returns the Baton
// instruments q shows.
func checkQuery(emitted series, from map[string]string, q query) (problems, shows []string) {
	p, err := parsePromQL(q.expr)
	if err != nil {
		return []string{fmt.Sprintf("%v in %s", err, q.expr)}, nil
	}
	if len(p.metrics) == 0 {
		problems = append(problems, "queries no series: "+q.expr)
	}
	var have []string
	for _, m := range p.metrics {
		if m == "" {
			problems = append(problems, "a selector without a series name: "+q.expr)
			continue
		}
		ls, ok := emitted[m]
		if !ok {
			problems = append(problems, fmt.Sprintf("queries %s, which Baton does not emit", m))
			continue
		}
		shows = append(shows, from[m])
		have = append(have, ls...)
	}
	for _, l := range p.labels {
		if !slices.Contains(have, l) {
			problems = append(problems, fmt.Sprintf("uses label %s, which %v do not carry", l, p.metrics))
		}
	}
	for _, m := range legendLabel.FindAllStringSubmatch(q.legend, -1) {
		if !slices.Contains(have, m[1]) {
			problems = append(problems, fmt.Sprintf("legend {{%s}} is no label of %v", m[1], p.metrics))
		}
	}
	return problems, shows
}

// TestDashboardQueriesBatonMetrics: every series the dashboard queries (panels and variables)
// is one Baton emits, named by the real exporter; every label it filters, groups or labels a
// legend by is one those series carry; and every Baton instrument appears on some panel.
func TestDashboardQueriesBatonMetrics(t *testing.T) {
	emitted, from := seriesOf(t, append(append(slices.Clip(batonInstruments), auditInstruments...), statusInstruments...))
	qs := dashboardQueries(t, []byte(readFile(t, dashboardFile)))
	if len(qs) < len(batonInstruments) {
		t.Fatalf("the dashboard has %d queries", len(qs))
	}
	shown := map[string]bool{}
	for _, q := range qs {
		problems, shows := checkQuery(emitted, from, q)
		for _, p := range problems {
			t.Errorf("%s: %s", q.where, p)
		}
		for _, s := range shows {
			shown[s] = true
		}
	}
	for _, in := range batonInstruments {
		if !shown[in.name] {
			t.Errorf("no panel shows %s", in.name)
		}
	}
}

// TestDashboardCheckCatchesMistakes: the check fails on a misspelt series, a series without
// its unit suffix, a label of another series and a legend label the query does not carry.
func TestDashboardCheckCatchesMistakes(t *testing.T) {
	emitted, from := exportedSeries(t)
	for _, q := range []query{
		{expr: `rate(baton_consumer_records_applied[5m])`},
		{expr: `baton_consumer_apply_duration_bucket`},
		{expr: `sum by (reason) (rate(baton_consumer_records_applied_total[5m]))`},
		{expr: `baton_outbox_backlog`, legend: "{{messaging_destination_name}}"},
		{expr: `sum(rat(baton_outbox_backlog[5m]))`},
	} {
		if problems, _ := checkQuery(emitted, from, q); len(problems) == 0 {
			t.Errorf("%s (legend %q) passed the check", q.expr, q.legend)
		}
	}
	if problems, _ := checkQuery(emitted, from, query{expr: `sum by (reason) (rate(baton_inbox_drops_total[5m]))`, legend: "{{reason}}"}); len(problems) != 0 {
		t.Errorf("a correct query failed: %v", problems)
	}
}

// TestDashboardVariables: the dashboard imports into any Grafana as it is: every panel and
// query reads the data source the datasource variable selects (no fixed uid), the group and
// instance variables filter the series that carry those labels, and an audit row shows
// baton_audit_violations_total by check.
func TestDashboardVariables(t *testing.T) {
	text := readFile(t, dashboardFile)
	var d struct {
		Templating struct {
			List []struct {
				Name, Type string
				Query      any
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal([]byte(text), &d); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		if v.Type == "datasource" && v.Query != "prometheus" {
			t.Errorf("variable %s selects %v data sources, want prometheus", v.Name, v.Query)
		}
	}
	for name, typ := range map[string]string{"datasource": "datasource", "group": "query", "instance": "query", "topic": "query"} {
		if vars[name] != typ {
			t.Errorf("the dashboard has no %s variable %q (variables %v)", typ, name, vars)
		}
	}
	uids := regexp.MustCompile(`"uid": "([^"]*)"`).FindAllStringSubmatch(text, -1)
	for _, m := range uids {
		if m[1] != "${datasource}" && m[1] != "baton" {
			t.Errorf("a data source is fixed to uid %q: use ${datasource}", m[1])
		}
	}
	qs := dashboardQueries(t, []byte(text))
	uses := map[string]bool{}
	audit := false
	for _, q := range qs {
		for _, v := range []string{"$group", "$instance"} {
			if strings.Contains(q.expr, v) {
				uses[v] = true
			}
		}
		if strings.Contains(q.expr, "baton_audit_violations_total") && strings.Contains(q.expr, "by (check)") {
			audit = true
		}
	}
	if !uses["$group"] || !uses["$instance"] {
		t.Errorf("the queries use the variables %v, want $group and $instance", uses)
	}
	if !audit {
		t.Error("no panel shows baton_audit_violations_total by check")
	}
}
