package deploytest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
)

const opsRulesFile = "deploy/prometheus/baton-rules.yml"

// statusInstruments is what `baton status -http` records (internal/operator/status/page.go);
// TestStatusInstrumentsMatchSource keeps it honest.
var statusInstruments = []instrument{
	{"internal/operator/status", "baton.status.lag", "gauge", "", []string{"baton.group", "messaging.destination.name", "messaging.destination.partition.id"}},
	{"internal/operator/status", "baton.status.outbox_backlog", "gauge", "", []string{"baton.group", "messaging.destination.name", "messaging.destination.partition.id"}},
	{"internal/operator/status", "baton.status.owned", "gauge", "", []string{"baton.group", "messaging.destination.name", "messaging.destination.partition.id"}},
	{"internal/operator/status", "baton.status.token.era", "gauge", "", []string{"baton.group", "messaging.destination.name", "messaging.destination.partition.id"}},
	{"internal/operator/status", "baton.status.token.epoch", "gauge", "", []string{"baton.group", "messaging.destination.name", "messaging.destination.partition.id"}},
	{"internal/operator/status", "baton.status.members", "gauge", "", []string{"baton.group"}},
	{"internal/operator/status", "baton.status.source_up", "gauge", "", []string{"baton.group", "baton.source"}},
	{"internal/operator/status", "baton.status.recoveries", "gauge", "", []string{"baton.group", "baton.by"}},
}

func TestStatusInstrumentsMatchSource(t *testing.T) {
	const pkg = "internal/operator/status"
	src := sourceInstruments(t, pkg)
	if len(src) != len(statusInstruments) {
		t.Errorf("the status page creates %d instruments, the table lists %d: %v", len(src), len(statusInstruments), src)
	}
	text := readSource(t, pkg)
	for _, in := range statusInstruments {
		if got, ok := src[in.name]; !ok || got != [2]string{in.kind, in.unit} {
			t.Errorf("%s: the source has %v (found %v), the table says %s with unit %q", in.name, got, ok, in.kind, in.unit)
		}
		for _, a := range in.attrs {
			if !strings.Contains(text, a) {
				t.Errorf("attribute %q of %s does not occur in the source", a, in.name)
			}
		}
	}
}

// opsAlerts are the situations an operator is paged for, each with its alert.
var opsAlerts = []string{
	"BatonPartitionStalled",    // stalled partitions
	"BatonApplyLagHigh",        // apply lag
	"BatonOutboxBacklogOld",    // outbox backlog age
	"BatonRegression",          // regressions (not handovers)
	"BatonZombieWriteRefused",  // refused zombie writes
	"BatonUnclaimedPartitions", // unclaimed partitions
	"BatonClientErrors",        // client errors
}

// checkRules decodes a rules file as Prometheus does and checks every expression against the
// series the programs export (plus the file's own recorded series); it returns the alerts.
func checkRules(t *testing.T, content string, ins []instrument) (alerts []string, problems []string) {
	t.Helper()
	groups, errs := parseRules([]byte(content))
	for _, err := range errs {
		problems = append(problems, err.Error())
	}
	if groups == nil {
		return nil, problems
	}
	emitted, _ := seriesOf(t, ins)
	label := regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				ps, _ := checkQuery(emitted, nil, query{where: r.Record, expr: r.Expr})
				for _, p := range ps {
					problems = append(problems, "record "+r.Record+": "+p)
				}
				// The recorded series carries the labels its aggregation keeps.
				e, err := parser.NewParser(parser.Options{}).ParseExpr(r.Expr)
				if agg, ok := e.(*parser.AggregateExpr); err != nil || !ok || agg.Without {
					problems = append(problems, "record "+r.Record+": not an aggregation by labels")
					continue
				} else {
					emitted[r.Record] = slices.Clone(agg.Grouping)
				}
				continue
			}
			alerts = append(alerts, r.Alert)
			var legend strings.Builder
			for _, a := range r.Annotations {
				for _, m := range label.FindAllStringSubmatch(a, -1) {
					legend.WriteString("{{" + m[1] + "}}")
				}
			}
			ps, _ := checkQuery(emitted, nil, query{where: r.Alert, expr: r.Expr, legend: legend.String()})
			for _, p := range ps {
				problems = append(problems, "alert "+r.Alert+": "+p)
			}
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				problems = append(problems, "alert "+r.Alert+": want a severity, a summary and a description")
			}
		}
	}
	return alerts, problems
}

// TestOperationsRules: the members' and the status page's rules decode strictly, read only
// series and labels the programs export, and alert on each situation of opsAlerts.
func TestOperationsRules(t *testing.T) {
	alerts, problems := checkRules(t, readFile(t, opsRulesFile), append(slices.Clip(batonInstruments), statusInstruments...))
	for _, p := range problems {
		t.Errorf("%s: %s", opsRulesFile, p)
	}
	for _, a := range opsAlerts {
		if !slices.Contains(alerts, a) {
			t.Errorf("%s has no alert %s", opsRulesFile, a)
		}
	}
}

// TestOperationsRulesCheckRejects proves the check can fail: a misspelt series, a label the
// series lack, a recorded series read with a label it dropped, a broken template.
func TestOperationsRulesCheckRejects(t *testing.T) {
	good := readFile(t, opsRulesFile)
	ins := append(slices.Clip(batonInstruments), statusInstruments...)
	for name, bad := range map[string]string{
		"missing series":        strings.Replace(good, "(baton_consumer_lag)", "(baton_consumer_lags)", 1),
		"label not there":       strings.Replace(good, "max by (baton_group, baton_source) (baton_status_source_up)", "max by (baton_group, instance_id) (baton_status_source_up)", 1),
		"recorded label gone":   strings.Replace(good, "expr: max by (job, messaging_destination_name, messaging_destination_partition_id) (baton_consumer_lag)", "expr: max by (job) (baton_consumer_lag)", 1),
		"broken template":       strings.Replace(good, "{{ $labels.baton_source }} for", "{{ $labels.baton_source for", 1),
		"unknown field":         strings.Replace(good, "        labels:\n", "        label:\n", 1),
		"annotation label gone": strings.Replace(good, "{{ $labels.instance }} tried", "{{ $labels.pod }} tried", 1),
	} {
		if bad == good {
			t.Fatalf("%s: the mutation did not apply", name)
		}
		if _, problems := checkRules(t, bad, ins); len(problems) == 0 {
			t.Errorf("%s: passed", name)
		}
	}
}

// TestPromtoolCheckRules runs Prometheus's own `promtool check rules` on every rules file. CI
// installs promtool (deploy/local/promtool.sh, run by with-services.sh): there, a missing
// promtool fails; elsewhere the test says how to get it and skips.
func TestPromtoolCheckRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool is not on PATH in CI: deploy/local/promtool.sh install (with-services.sh runs it)")
		}
		t.Skip("promtool is not on PATH: deploy/local/promtool.sh install (Debian's prometheus package) to run this check")
	}
	files, err := filepath.Glob(filepath.Join(root, "deploy/prometheus/*.yml"))
	if err != nil || len(files) < 2 {
		t.Fatalf("rules files: %v %v", files, err)
	}
	for _, f := range files {
		out, err := exec.Command(promtool, "check", "rules", f).CombinedOutput()
		if err != nil {
			t.Errorf("promtool check rules %s: %v\n%s", f, err, out)
		}
	}
	// promtool fails on a broken file (so a pass above means something).
	bad := filepath.Join(t.TempDir(), "bad.yml")
	if err := os.WriteFile(bad, []byte("groups:\n  - name: x\n    rules:\n      - alert: A\n        expr: sum(rate(x[5m])\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", bad).CombinedOutput(); err == nil {
		t.Errorf("promtool accepted a broken expression:\n%s", out)
	}
}

// TestReadmeListsAlerts: the README's operations section lists every alert of every rules file.
func TestReadmeListsAlerts(t *testing.T) {
	readme := readFile(t, "README.md")
	for _, f := range []string{opsRulesFile, auditRulesFile} {
		for _, m := range regexp.MustCompile(`(?m)^\s*- alert: (\S+)`).FindAllStringSubmatch(readFile(t, f), -1) {
			if !strings.Contains(readme, "`"+m[1]+"`") {
				t.Errorf("README.md does not list the alert %s (%s)", m[1], f)
			}
		}
	}
}
