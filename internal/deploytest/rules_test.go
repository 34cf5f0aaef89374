package deploytest

import (
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

const auditRulesFile = "deploy/prometheus/audit-rules.yml"

// auditInstruments is what the auditor records (internal/operator/audit/audit.go);
// TestAuditInstrumentsMatchSource keeps it honest.
var auditInstruments = []instrument{
	{"internal/operator/audit", "baton.audit.violations", "counter", "", []string{"check", "group", "topic", "partition"}},
	{"internal/operator/audit", "baton.audit.passes", "counter", "", []string{"outcome", "group"}},
	{"internal/operator/audit", "baton.audit.queries", "counter", "", []string{"group"}},
	{"internal/operator/audit", "baton.audit.bytes_read", "counter", "By", []string{"group"}},
	{"internal/operator/audit", "baton.audit.republished", "counter", "", []string{"group"}},
}

// auditChecks are the auditor's checks (the Check constants).
var auditChecks = []string{"skipped", "tokens", "outbox", "delivery", "inbox", "liveness", "ownership"}

func TestAuditInstrumentsMatchSource(t *testing.T) {
	const pkg = "internal/operator/audit"
	src := sourceInstruments(t, pkg)
	if len(src) != len(auditInstruments) {
		t.Errorf("the auditor creates %d instruments, the table lists %d: %v", len(src), len(auditInstruments), src)
	}
	text := readSource(t, pkg)
	for _, in := range auditInstruments {
		if got, ok := src[in.name]; !ok || got != [2]string{in.kind, in.unit} {
			t.Errorf("%s: the source has %v (found %v), the table says %s with unit %q", in.name, got, ok, in.kind, in.unit)
		}
		for _, a := range in.attrs {
			if !strings.Contains(text, strconv.Quote(a)) {
				t.Errorf("attribute %q of %s does not occur in the source", a, in.name)
			}
		}
	}
	for _, c := range auditChecks {
		if !regexp.MustCompile(`Check = "` + c + `"`).MatchString(text) {
			t.Errorf("the auditor has no check %q", c)
		}
	}
}

// parseRules decodes content as Prometheus does (rulefmt, unknown fields rejected, each
// expression parsed and each template checked).
func parseRules(content []byte) (*rulefmt.RuleGroups, []error) {
	return rulefmt.Parse(content, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
}

// TestAuditRules: the rules decode strictly; every series and label an expression or an
// annotation reads is one the auditor exports; every check has its alert.
func TestAuditRules(t *testing.T) {
	groups, errs := parseRules([]byte(readFile(t, auditRulesFile)))
	for _, err := range errs {
		t.Errorf("%s: %v", auditRulesFile, err)
	}
	if groups == nil {
		t.FailNow()
	}
	emitted, _ := seriesOf(t, auditInstruments)
	covered := map[string]bool{}
	label := regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)
	check := regexp.MustCompile(`check="([a-z]+)"`)
	alerts := 0
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("rule %q is not an alert", r.Record)
				continue
			}
			alerts++
			var legend strings.Builder
			for _, a := range r.Annotations {
				for _, m := range label.FindAllStringSubmatch(a, -1) {
					legend.WriteString("{{" + m[1] + "}}")
				}
			}
			problems, _ := checkQuery(emitted, nil, query{where: r.Alert, expr: r.Expr, legend: legend.String()})
			for _, p := range problems {
				t.Errorf("alert %s: %s", r.Alert, p)
			}
			if r.Labels["severity"] == "" {
				t.Errorf("alert %s has no severity", r.Alert)
			}
			for _, m := range check.FindAllStringSubmatch(r.Expr, -1) {
				if !slices.Contains(auditChecks, m[1]) {
					t.Errorf("alert %s filters check=%q, which the auditor does not have", r.Alert, m[1])
				}
				covered[m[1]] = true
			}
		}
	}
	for _, c := range auditChecks {
		if !covered[c] {
			t.Errorf("no alert for the auditor's check %q", c)
		}
	}
	if alerts < len(auditChecks) {
		t.Errorf("%d alerts, want at least one per check (%d)", alerts, len(auditChecks))
	}
}

// TestAuditRulesDecodingRejects proves the decoding strict: a misspelt field, a broken
// expression, a label the series lack and a broken template each fail.
func TestAuditRulesDecodingRejects(t *testing.T) {
	good := readFile(t, auditRulesFile)
	emitted, _ := seriesOf(t, auditInstruments)
	for name, bad := range map[string]string{
		"unknown field":   strings.Replace(good, "        labels:\n", "        label:\n", 1),
		"broken PromQL":   strings.Replace(good, `sum by (group) (increase(baton_audit_passes_total`, `sum by (group (increase(baton_audit_passes_total`, 1),
		"broken template": strings.Replace(good, "{{ $labels.group }}", "{{ $labels.group ", 1),
		"missing series":  strings.Replace(good, `baton_audit_passes_total{outcome="error"}`, `baton_audit_pass_total{outcome="error"}`, 1),
		"label not there": strings.Replace(good, `sum by (group) (increase(baton_audit_passes_total`, `sum by (member) (increase(baton_audit_passes_total`, 1),
	} {
		if bad == good {
			t.Fatalf("%s: the mutation did not apply", name)
		}
		groups, errs := parseRules([]byte(bad))
		failed := len(errs) > 0
		if !failed {
			for _, g := range groups.Groups {
				for _, r := range g.Rules {
					if problems, _ := checkQuery(emitted, nil, query{expr: r.Expr}); len(problems) > 0 {
						failed = true
					}
				}
			}
		}
		if !failed {
			t.Errorf("%s: passed", name)
		}
	}
}
