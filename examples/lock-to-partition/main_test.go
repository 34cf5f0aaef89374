package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestExample runs the program and checks the story it tells: the lock version loses the
// paused worker's successor's update; step 1 (the etcd lock, writes fenced with its token)
// refuses the paused worker's write and its job runs again; step 2 (Baton) refuses the paused
// member's write and keeps both deposits. In CI the lock version must run against the real
// Redis and step 1 against the real etcd.
func TestExample(t *testing.T) {
	defer goleak.VerifyNone(t)
	redis := os.Getenv("BATON_REDIS_ADDR")
	if redis == "" && os.Getenv("CI") != "" {
		t.Fatal("BATON_REDIS_ADDR is not set: CI must run the lock version against a real Redis (make test starts it)")
	}
	etcd := os.Getenv(envEtcd)
	if etcd == "" && os.Getenv("CI") != "" {
		t.Fatal(envEtcd + " is not set: CI must run step 1 against a real etcd (make test starts it; deploy/local/etcd.sh env prints it)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	must := []string{
		"[lock] worker-2 wrote 100 + 50 = 150",
		"[lock] worker-1 wrote 100 + 30 = 130", // computed from what it read before its pause
		"[baton] member B wrote 130 + 50 = 180",
		"[baton] zombie write refused: stale token",
		"verdict: redis lock: balance 130, expected 180 (LOST UPDATE); baton: balance 180, expected 180 (correct)",
	}
	must = append(must, "(1) step 1 with the Redis lock: not possible")
	if etcd != "" {
		must = append(must,
			"(etcd at "+etcd+")",
			"[etcd] worker-2 wrote 100 + 50 = 150 under token",
			"[etcd] zombie write refused: stale token",
			"[etcd] worker-1 wrote 150 + 30 = 180 under token", // its job ran again, under a new lease
			"verdict: step 1, etcd lock + fenced writes: balance 180, expected 180 (correct)",
		)
		// The refused write is worker-1's, under its first token, below worker-2's.
		m := regexp.MustCompile(`\[etcd\] worker-1 holds the lock with token (\S+),[^\n]*read balance 100\n(?s:.*?)\[etcd\] worker-2 holds the lock with token (\S+),(?s:.*?)\[etcd\] zombie write refused: stale token \(fence: stale token for \S+: presented (\S+), stored (\S+)\)`).FindStringSubmatch(out.String())
		if m == nil {
			t.Errorf("the output does not show worker-1's write refused under its first token")
		} else if m[3] != m[1] || m[4] != m[2] {
			t.Errorf("refused write presented %s against stored %s; want worker-1's %s against worker-2's %s", m[3], m[4], m[1], m[2])
		}
	} else {
		must = append(must, envEtcd+" is not set: SKIPPED")
	}
	if redis != "" {
		must = append(must, "(Redis at "+redis+")")
	} else {
		must = append(must, "IN-PROCESS STAND-IN")
	}
	for _, line := range must {
		if !strings.Contains(out.String(), line) {
			t.Errorf("the output lacks %q", line)
		}
	}
}
