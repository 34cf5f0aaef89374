package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestExample runs the program and checks the story it tells: the lock version loses the
// paused worker's successor's update, Baton refuses the paused member's write and keeps both
// deposits. In CI the lock version must run against the real Redis.
func TestExample(t *testing.T) {
	defer goleak.VerifyNone(t)
	redis := os.Getenv("BATON_REDIS_ADDR")
	if redis == "" && os.Getenv("CI") != "" {
		t.Fatal("BATON_REDIS_ADDR is not set: CI must run the lock version against a real Redis (make test starts it)")
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
