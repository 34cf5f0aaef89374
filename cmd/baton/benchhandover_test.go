package main

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/batonhq/baton/internal/testkit/testenv"
)

// TestBenchHandoverFlags: a handover bench that cannot run exits 2 naming the problem, before
// it connects anywhere.
func TestBenchHandoverFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-brokers", "", "-postgres", ""}, "-brokers and -postgres are required"},
		{[]string{"-brokers", "x:1", "-postgres", "p", "-profile", "nope"}, `-profile "nope"`},
		{[]string{"-brokers", "x:1", "-postgres", "p", "-kinds", "graceful,nope"}, `unknown kind "nope"`},
		{[]string{"-brokers", "x:1", "-postgres", "p", "-trials", "0"}, "-trials 0"},
	} {
		var out bytes.Buffer
		if code := run(append([]string{"bench", "handover"}, tc.args...), io.Discard, &out); code != 2 {
			t.Errorf("bench handover %q exited %d, want 2", tc.args, code)
		}
		if !strings.Contains(out.String(), tc.want) {
			t.Errorf("bench handover %q: stderr lacks %q:\n%s", tc.args, tc.want, out.String())
		}
	}
}

// TestBenchHandoverRuns runs one graceful trial on the real services: two member processes
// (this test binary standing in for baton), a SIGTERM, the survivor's commits of the moved
// partitions. It checks the bench works, not how fast.
func TestBenchHandoverRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("starts member processes")
	}
	brokers := testenv.KafkaBrokers(t)
	pg := testenv.PostgresURL(t)
	var out, errb bytes.Buffer
	code := run([]string{"bench", "handover", "-brokers", strings.Join(brokers, ","), "-postgres", pg,
		"-kinds", "graceful", "-trials", "1", "-session", "6s"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exited %d:\n%s\n%s", code, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "| graceful | 1 |") || !strings.Contains(errb.String(), "graceful trial 1:") {
		t.Fatalf("no graceful trial reported:\n%s\n%s", out.String(), errb.String())
	}
}
