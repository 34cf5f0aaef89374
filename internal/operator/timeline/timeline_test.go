package timeline

import (
	"encoding/xml"
	"strings"
	"testing"
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
