package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestScalePoints: the default point, then one axis at a time; a large record has fewer
// records (bounded in bytes), never fewer than one per key, in whole records per key.
func TestScalePoints(t *testing.T) {
	cfg := ScaleConfig{Config: Config{Records: 100_000, Keys: 1000, Partitions: 12, Size: 100},
		AxisPartitions: []int{12, 96}, AxisKeys: []int{1000, 1_000_000}, AxisSizes: []int{100, 10240}, MaxBytes: 100 << 20}
	got := cfg.Points()
	want := []ScalePoint{
		{"", 100_000, 1000, 12, 100},
		{"partitions", 100_000, 1000, 96, 100},
		{"keys", 1_000_000, 1_000_000, 12, 100},
		{"size", 10_000, 1000, 12, 10240}, // 100 MiB / 10 KiB = 10240 records, 10 per key
	}
	if len(got) != len(want) {
		t.Fatalf("points %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("point %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

// TestScaleOutput: the table has a row per design and point, the chart a bar per design and
// point, and a design that did not count says so.
func TestScaleOutput(t *testing.T) {
	rows := []Row{{Design: "baton-fast", OK: 1, Runs: 1, Rate: 1000}, {Design: "ceiling/2", OK: 1, Runs: 1, Rate: 900}, {Design: "ceiling/4", OK: 1, Runs: 1, Rate: 2000}}
	res := []ScaleResult{
		{Point: ScalePoint{Records: 10, Keys: 2, Partitions: 3, Size: 100}, Rows: bestCeiling(rows)},
		{Point: ScalePoint{Axis: "partitions", Records: 10, Keys: 2, Partitions: 6, Size: 100}, Rows: []Row{{Design: "baton-fast", Runs: 1, FirstError: "check: wrong"}}},
	}
	if len(res[0].Rows) != 2 || res[0].Rows[1].Design != "ceiling" || res[0].Rows[1].Rate != 2000 {
		t.Fatalf("best ceiling: %+v", res[0].Rows)
	}
	var b bytes.Buffer
	WriteScaleTable(&b, res, Conditions{}, time.Minute)
	for _, want := range []string{"| (all defaults) | default | 10 | 2 | 3 | 100 B | ceiling | 2000 |", "| partitions | 6 |", "did not count: check: wrong"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	WriteScaleChart(&b, res, Conditions{})
	if n := strings.Count(b.String(), "<rect x=\"170\""); n != 4 {
		t.Errorf("chart has %d bars, want 4 (two designs at two points):\n%s", n, b.String())
	}
}
