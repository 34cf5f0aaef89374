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
	if len(os.Args) > 1 && (os.Args[1] == "worker" || os.Args[1] == handoverWorkerCommand) {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	goleak.VerifyTestMain(m)
}

// TestDemo runs the README's first command, 'baton demo', on its embedded defaults and checks
// its verdict: every invariant held, a zombie write was attempted and refused, and every
// command sent through the outbox was applied exactly once. It then checks that the demo's
// temporary directory is gone and the demo said so.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("the demo takes about 20 seconds")
	}
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp) // the demo's temporary directory goes here
	var out bytes.Buffer
	// The backlog's bound is the demo's minute on a quiet machine; a loaded one (the test
	// suite's lanes beside it) needs longer.
	if code := run([]string{"demo", "-settle", "3m"}, &out, io.Discard); code != 0 {
		t.Fatalf("baton demo exited %d; output:\n%s", code, out.String())
	}
	if dirs, _ := filepath.Glob(filepath.Join(tmp, "baton-demo-*")); len(dirs) != 0 {
		t.Errorf("the demo left its temporary directory behind: %v", dirs)
	}
	if !regexp.MustCompile(`(?m)^removed ` + regexp.QuoteMeta(tmp) + `/baton-demo-\S+ \(-keep keeps it\)$`).MatchString(out.String()) {
		t.Errorf("the demo did not say it removed its directory:\n%s", out.String())
	}
	b := out.Bytes()
	if i := bytes.Index(b, []byte("\nmode ")); i >= 0 {
		b = b[i+1:]
	} else {
		t.Fatalf("no verdict in the output:\n%s", out.String())
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
}

// TestDemoKeepsEvidence: a demo that fails (here: no freeze, so nothing was proven) keeps its
// temporary directory without -keep, with the database, the workers' logs, the verdict and
// the report in it, and says where it is.
func TestDemoKeepsEvidence(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo for about 10 seconds")
	}
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	var out bytes.Buffer
	var errb bytes.Buffer
	if code := run([]string{"demo", "-freezes", "0", "-devices", "10", "-updates", "5"}, &out, &errb); code != 1 {
		t.Fatalf("baton demo -freezes 0 exited %d, want 1; output:\n%s%s", code, out.String(), errb.String())
	}
	if !strings.Contains(errb.String(), "no zombie write was refused") {
		t.Errorf("the failure is not explained: %s", errb.String())
	}
	dirs, _ := filepath.Glob(filepath.Join(tmp, "baton-demo-*"))
	if len(dirs) != 1 {
		t.Fatalf("want the demo's directory kept, found %v", dirs)
	}
	dir := dirs[0]
	if !strings.Contains(out.String(), "kept "+dir+" (the demo failed") {
		t.Errorf("the demo did not say it kept %s:\n%s", dir, out.String())
	}
	for _, f := range []string{"twins.db", "report/fenced-verdict.txt", "report/fenced/index.html", "report/fenced/faults.html"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("evidence missing: %v", err)
		}
	}
	if logs, _ := filepath.Glob(filepath.Join(dir, "baton-chaos-w*.log")); len(logs) == 0 {
		t.Errorf("no worker logs in %s", dir)
	}
	svg, err := os.ReadFile(filepath.Join(dir, "report", "fenced", "lanes-01.svg"))
	if err != nil || !strings.Contains(string(svg), "<svg") {
		t.Errorf("no timeline: %v", err)
	}
	if !strings.Contains(out.String(), filepath.Join(dir, "report", "fenced", "index.html")) {
		t.Errorf("the demo did not say where its report is:\n%s", out.String())
	}
}

// TestFinishTempDir: the temporary directory is removed after a passing run, kept with -keep,
// and kept after a failing run whatever -keep says; the demo says which.
func TestFinishTempDir(t *testing.T) {
	for _, tc := range []struct {
		keep, failed, kept bool
		says               string
	}{
		{false, false, false, "removed "},
		{true, false, true, "kept "},
		{false, true, true, "kept "},
		{true, true, true, "kept "},
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "twins.db"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if err := finishTempDir(&out, dir, tc.keep, tc.failed); err != nil {
			t.Fatal(err)
		}
		_, err := os.Stat(dir)
		if kept := err == nil; kept != tc.kept {
			t.Errorf("keep=%v failed=%v: kept=%v, want %v", tc.keep, tc.failed, kept, tc.kept)
		}
		if !strings.HasPrefix(out.String(), tc.says+dir) {
			t.Errorf("keep=%v failed=%v: said %q, want %q...", tc.keep, tc.failed, out.String(), tc.says+dir)
		}
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
		{[]string{"demo", "-h"}, 0, "-keep"},
		{[]string{"demo", "-freezes", "-1"}, 2, "-freezes not negative"},
		{[]string{"demo", "-settle", "0s"}, 2, "-settle must be positive"},
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
		{[]string{"chaos", "-h"}, 0, "shard-outage"},
		{[]string{"chaos", "-h"}, 0, "-audit"},
		{[]string{"chaos", "-audit", "-1s"}, 2, "-audit -1s: not negative"},
		{[]string{"chaos", "-brokers", "k:1", "-postgres", "postgres://h/db", "-shards", "h:1/db"}, 2, "neither NAME=URL nor a postgres:// URL"},
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

// TestBenchFlags: 'baton bench -h' documents the flags the issue names, and a command line
// that cannot run exits 2 with every problem named, before anything is built or connected.
func TestBenchFlags(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"bench", "-h"}, io.Discard, &out); code != 0 {
		t.Fatalf("bench -h exited %d", code)
	}
	for _, f := range []string{"-records", "-keys", "-partitions", "-rounds", "-designs", "-out", "-peers"} {
		if !strings.Contains(out.String(), f) {
			t.Errorf("bench -h does not list %s:\n%s", f, out.String())
		}
	}
	out.Reset()
	code := run([]string{"bench", "-records", "5", "-keys", "10", "-designs", "nope", "-brokers", "", "-postgres", ""}, io.Discard, &out)
	if code != 2 {
		t.Errorf("an impossible bench exited %d, want 2", code)
	}
	for _, want := range []string{"-records 5", `unknown design "nope"`, "needs Kafka"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("stderr does not mention %q:\n%s", want, out.String())
		}
	}
	if code := run([]string{"bench", "-conns", "x"}, io.Discard, io.Discard); code != 2 {
		t.Errorf("-conns x exited %d, want 2", code)
	}
}
