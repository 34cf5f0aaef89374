package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// TestMain lets this test binary stand in for the baton binary: the demo starts its workers by
// re-running its own executable with the "worker" command.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		os.Exit(run(os.Args[1:]))
	}
	goleak.VerifyTestMain(m)
}

// TestDemo runs the README's first command, 'baton demo', on its embedded defaults and checks
// its verdict: every invariant held, a zombie write was attempted and refused, and every
// command sent through the outbox was applied exactly once.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("the demo takes about 20 seconds")
	}
	dir := t.TempDir()
	if code := run([]string{"demo", "-dir", dir}); code != 0 {
		t.Fatalf("baton demo exited %d", code)
	}
	b, err := os.ReadFile(filepath.Join(dir, "report", "fenced-verdict.txt"))
	if err != nil {
		t.Fatal(err)
	}
	verdict := string(b)
	t.Logf("verdict:\n%s", verdict)
	if !regexp.MustCompile(`(?m)^verdict\s+PASS$`).MatchString(verdict) {
		t.Errorf("verdict is not PASS")
	}
	field := func(name string) int {
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\s+(\d+)`).FindStringSubmatch(verdict)
		if m == nil {
			t.Fatalf("no %q line in the verdict", name)
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	if m := regexp.MustCompile(`faults: freeze\s+(\d+) injected, (\d+) proven`).FindStringSubmatch(verdict); m == nil || m[1] != m[2] || m[1] == "0" {
		t.Errorf("not every freeze led to a takeover: %v", m)
	}
	if field("zombie writes refused") == 0 {
		t.Errorf("no zombie write was refused")
	}
	if field("zombie writes committed") != 0 {
		t.Errorf("a zombie write committed")
	}
	m := regexp.MustCompile(`commands via outbox: sent / applied via inbox\s+(\d+) / (\d+)`).FindStringSubmatch(verdict)
	if m == nil || m[1] == "0" || m[1] != m[2] {
		t.Errorf("commands sent and applied differ or are missing: %v", m)
	}
	svg, err := os.ReadFile(filepath.Join(dir, "report", "fenced-timeline.svg"))
	if err != nil || !strings.Contains(string(svg), "<svg") {
		t.Errorf("no timeline: %v", err)
	}
}
