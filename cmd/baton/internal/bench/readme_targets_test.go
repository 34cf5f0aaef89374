package bench

import (
	"strings"
	"testing"
	"time"
)

// The README's program is measured against its handler shape on PostgreSQL unpipelined, the
// baton design's "vs ceiling" divides by SQLite's ceiling (it runs on SQLite), and the
// pipelined PostgreSQL shape is reported beside it.
func TestReadmeTargets(t *testing.T) {
	rep := func(d string, recs int64, wall time.Duration) Report {
		return Report{Design: d, Records: recs, Wall: wall}
	}
	rows := Summarize([]Result{
		{Design: "baton", Round: 0, Report: rep("baton", 90, time.Second)},
		{Design: "baton-pg", Round: 0, Report: rep("baton-pg", 60, time.Second)},
		{Design: "baton-pg-sync", Round: 0, Report: rep("baton-pg-sync", 20, time.Second)},
		{Design: "sqlite-ceiling", Round: 0, Report: rep("sqlite-ceiling", 180, time.Second)},
		{Design: "ceiling/1", Round: 0, Report: rep("ceiling", 900, time.Second)},
	})
	for _, r := range rows {
		if r.Design == "baton" && r.VsCeiling != 0.5 {
			t.Errorf("baton vs ceiling %v, want 0.5: the SQLite ceiling's", r.VsCeiling)
		}
	}
	var b strings.Builder
	WriteTargets(&b, rows)
	for _, want := range []string{
		"baton (the README's program) / baton-pg-sync (its handler shape on PostgreSQL, unpipelined; ratio of the median rates): **4.50, met** (target >= 3.00)",
		"baton-pg / baton-pg-sync (the per-record handler on PostgreSQL, pipelined vs not; ratio of the median rates): 3.00 (no target)",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("targets lack %q:\n%s", want, b.String())
		}
	}
}
