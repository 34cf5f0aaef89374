package main

import (
	"bytes"
	"io"
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
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
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
	if code := run([]string{"demo", "-dir", dir}, io.Discard, io.Discard); code != 0 {
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
	// Errors are named: the causes listed under the error count add up to it.
	if m := regexp.MustCompile(`(?m)^write attempts: error\s+(\d+)$`).FindStringSubmatch(verdict); m != nil {
		want, _ := strconv.Atoi(m[1])
		got := 0
		for _, c := range regexp.MustCompile(`(?m)^  error: .+?\s+(\d+)  .+; e\.g\. ".+"$`).FindAllStringSubmatch(verdict, -1) {
			n, _ := strconv.Atoi(c[1])
			got += n
		}
		if got != want {
			t.Errorf("%d write attempts failed with an error, but the causes listed account for %d", want, got)
		}
	}
	svg, err := os.ReadFile(filepath.Join(dir, "report", "fenced-timeline.svg"))
	if err != nil || !strings.Contains(string(svg), "<svg") {
		t.Errorf("no timeline: %v", err)
	}
}

// TestCommandLine: help exits 0 after printing it; an unknown command or flag, a bad value or a
// stray argument exits 2 with the usage; nothing runs in either case.
func TestCommandLine(t *testing.T) {
	t.Setenv("BATON_KAFKA_BROKERS", "")
	t.Setenv("BATON_POSTGRES_URL", "")
	for _, tc := range []struct {
		args []string
		code int
		want string // in stdout+stderr
	}{
		{[]string{"-h"}, 0, "commands:"},
		{[]string{"help"}, 0, "commands:"},
		{[]string{"demo", "-h"}, 0, "-updates"},
		{[]string{"demo", "--help"}, 0, "-devices"},
		{[]string{"chaos", "-h"}, 0, "-num-faults"},
		{[]string{"worker", "-h"}, 0, ""}, // the worker's flags go to the process's stderr
		{nil, 2, "commands:"},
		{[]string{"nope"}, 2, `unknown command "nope"`},
		{[]string{"demo", "-nope"}, 2, "flag provided but not defined: -nope"},
		{[]string{"demo", "-devices", "many"}, 2, "usage: baton demo"},
		{[]string{"demo", "stray"}, 2, `unexpected arguments ["stray"]`},
		{[]string{"chaos", "-nope"}, 2, "usage: baton chaos"},
		{[]string{"chaos", "-mode", "optimistic"}, 2, "unknown mode"},
		{[]string{"chaos", "-faults", "freeze,flood"}, 2, "unknown fault"},
		{[]string{"chaos"}, 2, "needs -brokers and -postgres"},
		{[]string{"worker", "-nope"}, 2, "bad worker command line"},
		{[]string{"worker", "-id", "w1"}, 2, "exactly one of -postgres and -sqlite"},
	} {
		var out, errb bytes.Buffer
		code := run(tc.args, &out, &errb)
		all := out.String() + errb.String()
		if code != tc.code {
			t.Errorf("baton %q exited %d, want %d; output:\n%s", tc.args, code, tc.code, all)
			continue
		}
		if !strings.Contains(all, tc.want) {
			t.Errorf("baton %q: output lacks %q:\n%s", tc.args, tc.want, all)
		}
		if tc.code == 0 && strings.Contains(all, "baton "+tc.args[0]+": ") {
			t.Errorf("baton %q: help reported as an error:\n%s", tc.args, all)
		}
	}
}
