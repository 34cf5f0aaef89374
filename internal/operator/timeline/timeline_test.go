package timeline

import (
	"encoding/xml"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestWrite(t *testing.T) {
	var b strings.Builder
	err := Write(&b, Timeline{
		Title: "run <1>", Lanes: 2, FromMS: 0, ToMS: 1000,
		Batches: []Batch{{Lane: 0, AtMS: 100, Era: 0, Epoch: 3, Who: "w&1"}, {Lane: 1, AtMS: 900, Era: 1, Epoch: 0, Who: "w2", Count: 5}},
		Marks:   []Mark{{Lane: 1, AtMS: 500, Who: "w1", Outcome: "stale", Token: "0.3", Zombie: true}, {Lane: 0, AtMS: 400, Who: "w1", Frozen: true, Token: "0.3"}},
		Bands:   []Band{{StartMS: 450, EndMS: 600, Label: "freeze w1"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	svg := b.String()
	// Well-formed XML: every text escaped.
	dec := xml.NewDecoder(strings.NewReader(svg))
	for {
		if _, err := dec.Token(); err != nil {
			if err.Error() != "EOF" {
				t.Fatalf("not well-formed SVG: %v\n%s", err, svg)
			}
			break
		}
	}
	for _, want := range []string{"run &lt;1&gt;", "partition 0", "partition 1", "1 batches; last by w&amp;1, token 0.3",
		"5 batches; last by w2, token 1.0", "w1 stale with token 0.3", "<circle", "froze holding token 0.3", "1: freeze w1"} {
		if !strings.Contains(svg, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	if strings.Count(svg, "<rect x=") != 3 { // two batch ticks and one band
		t.Errorf("want 2 ticks and 1 band:\n%s", svg)
	}
}

// Touching ticks of one writer under one token are one tick counting all their batches; a new
// token, a new writer or a gap starts another.
func TestWriteMergesTicks(t *testing.T) {
	var batches []Batch
	for ms := int64(0); ms < 500; ms += 2 { // a tick every other column, token 0.1
		batches = append(batches, Batch{Lane: 0, AtMS: ms, Epoch: 1, Who: "w1"})
	}
	for ms := int64(500); ms < 700; ms += 2 { // then token 0.2
		batches = append(batches, Batch{Lane: 0, AtMS: ms, Epoch: 2, Who: "w2"})
	}
	batches = append(batches, Batch{Lane: 0, AtMS: 900, Epoch: 2, Who: "w2"}) // after a gap
	var b strings.Builder
	if err := Write(&b, Timeline{Lanes: 1, FromMS: 0, ToMS: 1000, Batches: batches}); err != nil {
		t.Fatal(err)
	}
	svg := b.String()
	for _, want := range []string{"250 batches; last by w1, token 0.1", "100 batches; last by w2, token 0.2", "1 batches; last by w2, token 0.2"} {
		if !strings.Contains(svg, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	if n := strings.Count(svg, "batches; last by"); n != 3 {
		t.Errorf("%d ticks, want 3:\n%s", n, svg)
	}
}

// With BandStrip the bands are bars above the lanes, stacked where they overlap, each with its
// label as a tooltip and its link; no label is listed under the lanes.
func TestWriteBandStrip(t *testing.T) {
	var b strings.Builder
	err := Write(&b, Timeline{Lanes: 1, FromMS: 0, ToMS: 1000, BandStrip: true, Bands: []Band{
		{StartMS: 100, EndMS: 400, Label: "freeze <w1>", Href: "faults.html#f1"},
		{StartMS: 200, EndMS: 300, Label: "crash w2", Href: "faults.html#f2"},
		{StartMS: 400, EndMS: 500, Label: "storm"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	svg := b.String()
	for _, want := range []string{`<a href="faults.html#f1"><rect`, "<title>1: freeze &lt;w1&gt;</title>", `<a href="faults.html#f2">`, "<title>3: storm</title>"} {
		if !strings.Contains(svg, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	if strings.Contains(svg, `">1: freeze`) || strings.Contains(svg, "opacity") {
		t.Errorf("bands listed or shaded as well:\n%s", svg)
	}
	rows := regexp.MustCompile(`<rect x="[\d.]+" y="(\d+)" width="[\d.]+" height="5"`).FindAllStringSubmatch(svg, -1)
	if len(rows) != 3 || rows[0][1] == rows[1][1] || rows[0][1] != rows[2][1] {
		t.Errorf("want the overlapping bands in two rows and the third back in the first: %v", rows)
	}
}

// The summary draws a bar per step with counts, stacked parts in order, its tooltip naming the
// row, the step and each part's count (in the part's own words when it has them), and a fixed
// width whatever the steps.
func TestWriteSummary(t *testing.T) {
	s := Summary{Title: "run <1>", FromMS: 0, StepMS: 60_000, Steps: 120, Rows: []Row{
		{Label: "freeze & co", Note: "3 (2 proven)", Heading: "Faults", Parts: []Part{
			{Name: "proven", Colour: "#111", Counts: []int64{0, 2}},
			{Name: "not proven", Colour: "#999", Counts: []int64{0, 0, 0, 1}},
		}},
		{Label: "applied", Height: 40, Parts: []Part{{Name: "records", Colour: "#222", Counts: []int64{5, 0, 10}}}},
		{Label: "lag", Parts: []Part{{Name: "ms", Colour: "#333", Counts: []int64{0, 0, 0, 0, 1250},
			Text: func(n int64) string { return fmt.Sprintf("largest %.2f s <", float64(n)/1000) }}}},
	}}
	var b strings.Builder
	if err := WriteSummary(&b, s); err != nil {
		t.Fatal(err)
	}
	svg := b.String()
	dec := xml.NewDecoder(strings.NewReader(svg))
	for {
		if _, err := dec.Token(); err != nil {
			if err.Error() != "EOF" {
				t.Fatalf("not well-formed SVG: %v", err)
			}
			break
		}
	}
	for _, want := range []string{"run &lt;1&gt;", "freeze &amp; co, +1:00–+2:00: 2 proven</title>", "freeze &amp; co, +3:00–+4:00: 1 not proven</title>",
		"applied, +0:00–+1:00: 5 records</title>", "applied, +2:00–+3:00: 10 records</title>", ">3 (2 proven)<", ">Faults<",
		"lag, +4:00–+5:00: largest 1.25 s &lt;</title>",
		fmt.Sprintf(`width="%d" height="%d"`, SummaryWidth, SummaryHeight(s))} {
		if !strings.Contains(svg, want) {
			t.Errorf("summary lacks %q", want)
		}
	}
	if n := strings.Count(svg, "<title>"); n != 5 {
		t.Errorf("%d bars, want 5 (one per step with a count)", n)
	}
	// The largest bar of a row is its full height: 10 records in 40 px, 5 in 20.
	if !strings.Contains(svg, `height="40.0" fill="#222"`) || !strings.Contains(svg, `height="20.0" fill="#222"`) {
		t.Errorf("bars not scaled to the row's largest:\n%s", svg)
	}
}

// A lane label wider than its column keeps its end, the partition, and the whole of it is the
// tooltip.
func TestWriteClipsLaneLabels(t *testing.T) {
	var b strings.Builder
	if err := Write(&b, Timeline{Lanes: 2, FromMS: 0, ToMS: 1000, LaneLabels: []string{"orders-2026-<eu>/12", "partition 1000"}}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<title>orders-2026-&lt;eu&gt;/12</title>…-2026-&lt;eu&gt;/12</text>", ">partition 1000</text>"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("SVG lacks %q:\n%s", want, b.String())
		}
	}
	if n := strings.Count(b.String(), "<line"); n != 2 {
		t.Errorf("%d lane lines, want 2", n)
	}
}

func TestStepAndOffset(t *testing.T) {
	for _, c := range []struct {
		span time.Duration
		want time.Duration
	}{{90 * time.Second, time.Second}, {5 * time.Minute, 5 * time.Second}, {2 * time.Hour, time.Minute}, {2*time.Hour + time.Second, 2 * time.Minute}, {100 * 24 * time.Hour, 24 * time.Hour}} {
		if got := Step(c.span, 120); got != c.want {
			t.Errorf("Step(%s, 120) = %s, want %s", c.span, got, c.want)
		}
	}
	for d, want := range map[time.Duration]string{0: "+0:00", 65 * time.Second: "+1:05", 1500 * time.Millisecond: "+0:01.5", time.Hour + 2*time.Minute + 3*time.Second: "+1:02:03"} {
		if got := Offset(d); got != want {
			t.Errorf("Offset(%s) = %q, want %q", d, got, want)
		}
	}
}
