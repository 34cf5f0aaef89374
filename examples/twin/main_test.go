package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestExample runs the pipeline and checks the story it tells: the frozen member's held
// write is refused as stale, the inbox drops a re-published command, and the verdict (every
// twin at the version of its number of updates, every command applied once, at least one
// zombie write refused) passes. run returns an error if any invariant fails.
func TestExample(t *testing.T) {
	defer goleak.VerifyNone(t)
	runStory(t, nil, nil, "member A owns device-updates/0 with token 0.1", "d-07        20.5     21.5       12")
}

// runStory runs the demo with args and checks the lines every run prints, and want.
func runStory(t *testing.T, args []string, after func(out string), want ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, args, &out)
	t.Logf("output:\n%s", out.String())
	if after != nil {
		after(out.String())
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range append(want,
		"member B took over after A's session expired",
		"zombie write refused: stale token",
		"the gateway applied 32 commands",
		"the gateway's inbox dropped the copy",
		"verdict: PASS: 8 twins, each at version 12 = its updates; 32 commands, each applied once; zombie writes refused: ",
	) {
		if !strings.Contains(out.String(), line) {
			t.Errorf("the output lacks %q", line)
		}
	}
}
