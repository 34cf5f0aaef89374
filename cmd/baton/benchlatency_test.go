package main

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

func TestBenchLatencyAndScaleFlags(t *testing.T) {
	for mode, flags := range map[string][]string{
		"latency": {"-rates", "-warmup", "-duration", "-fetch-max-wait", "-linger", "-designs", "-out"},
		"scale":   {"-axis-partitions", "-axis-keys", "-axis-sizes", "-max-bytes", "-records", "-conns", "-out"},
	} {
		var out bytes.Buffer
		if code := run([]string{"bench", mode, "-h"}, io.Discard, &out); code != 0 {
			t.Fatalf("bench %s -h exited %d", mode, code)
		}
		for _, f := range flags {
			if !strings.Contains(out.String(), f) {
				t.Errorf("bench %s -h does not list %s", mode, f)
			}
		}
	}
	for _, args := range [][]string{
		{"bench", "latency", "-rates", "0"},
		{"bench", "latency", "-rates", "50%nope"},
		{"bench", "latency", "-fetch-max-wait", "-1s"},
		{"bench", "latency", "-designs", "ceiling", "-brokers", "x", "-postgres", "y"},
		{"bench", "scale", "-axis-keys", "a"},
		{"bench", "scale", "-max-bytes", "0"},
		{"bench", "-fetch-max-bytes", "0"},
		{"bench", "scale", "-fetch-max-partition-bytes", "x"},
		{"bench", "scale", "-designs", "naive", "-brokers", "x", "-postgres", "y"},
	} {
		var out bytes.Buffer
		if code := run(args, io.Discard, &out); code != 2 {
			t.Errorf("%q exited %d, want 2 (usage):\n%s", args, code, out.String())
		}
	}
}
