package timeline

import (
	"fmt"
	"html"
	"io"
	"strings"
	"time"
)

// Summary is what WriteSummary draws: rows of counts per time step over one time axis, a
// stacked bar per step and row. However long the run and however many its faults, the drawing
// has one column per step and one row per series, so its size is bounded by the caller's
// choice of step (Step picks one) and rows.
type Summary struct {
	Title   string
	Caption string
	FromMS  int64 // Unix milliseconds; the axis is labelled relative to it
	StepMS  int64 // the width of a step
	Steps   int   // how many steps the axis has
	Rows    []Row
}

// Row is one series of the summary: per step a bar stacking its parts bottom-up.
type Row struct {
	Label   string
	Note    string // right of the row, e.g. its totals
	Height  int    // pixels; 0 means 14
	Max     int64  // the count a full-height bar stands for; 0 means the row's largest stack
	Parts   []Part
	Heading string // a section title drawn above the row (none if empty)
}

// Part is one stacked part of a row's bars: its count in each step.
type Part struct {
	Name   string // in each bar's tooltip
	Colour string
	Counts []int64 // per step; missing steps count 0
	// Text, if set, says a count in the bars' tooltips, for a count that is not of things (a
	// duration in milliseconds, say); otherwise a tooltip says "<count> <Name>".
	Text func(n int64) string
}

// Step returns a round step that cuts span into at most n steps: a second, a minute or an hour
// multiple, so the axis reads naturally.
func Step(span time.Duration, n int) time.Duration {
	for _, s := range []time.Duration{time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second,
		15 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute,
		15 * time.Minute, 30 * time.Minute, time.Hour, 2 * time.Hour, 6 * time.Hour, 12 * time.Hour} {
		if span <= s*time.Duration(n) {
			return s
		}
	}
	return 24 * time.Hour * (span/(24*time.Hour*time.Duration(max(n, 1))) + 1)
}

// Summary geometry: a label column, the plot, and a note column; the drawing is SummaryWidth
// pixels wide whatever the steps.
const (
	SummaryWidth = 1360
	sumLeft      = 180
	sumRight     = 240
	sumTop       = 56
)

// SummaryHeight is the height WriteSummary gives s.
func SummaryHeight(s Summary) int {
	h := sumTop + 34
	for _, r := range s.Rows {
		h += rowHeight(r) + 4
		if r.Heading != "" {
			h += 20
		}
	}
	return h
}

func rowHeight(r Row) int {
	if r.Height <= 0 {
		return 14
	}
	return r.Height
}

// WriteSummary writes s as one SVG document. Each bar's tooltip names the row, the step and
// every part's count.
func WriteSummary(w io.Writer, s Summary) error {
	steps := max(s.Steps, 1)
	plot := float64(SummaryWidth - sumLeft - sumRight)
	colW := plot / float64(steps)
	x := func(i int) float64 { return sumLeft + float64(i)*colW }
	height := SummaryHeight(s)
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", SummaryWidth, height)
	fmt.Fprintf(w, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(w, `<text x="10" y="20" font-size="14" font-weight="bold">%s</text>`+"\n", html.EscapeString(s.Title))
	fmt.Fprintf(w, `<text x="10" y="38">%s</text>`+"\n", html.EscapeString(s.Caption))
	y := sumTop
	for _, r := range s.Rows {
		if r.Heading != "" {
			y += 20
			fmt.Fprintf(w, `<text x="10" y="%d" font-weight="bold">%s</text>`+"\n", y-6, html.EscapeString(r.Heading))
		}
		h := rowHeight(r)
		fmt.Fprintf(w, `<text x="10" y="%d">%s</text>`+"\n", y+min(h, 14)-3, html.EscapeString(r.Label))
		fmt.Fprintf(w, `<text x="%d" y="%d">%s</text>`+"\n", SummaryWidth-sumRight+8, y+min(h, 14)-3, html.EscapeString(r.Note))
		fmt.Fprintf(w, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#ddd"/>`+"\n", sumLeft, SummaryWidth-sumRight, y+h, y+h)
		top := r.Max
		if top <= 0 {
			for i := 0; i < steps; i++ {
				top = max(top, stackAt(r, i))
			}
		}
		for i := 0; i < steps; i++ {
			total := stackAt(r, i)
			if total == 0 {
				continue
			}
			var tip []string
			for _, p := range r.Parts {
				if n := countAt(p, i); n > 0 && p.Text != nil {
					tip = append(tip, p.Text(n))
				} else if n > 0 {
					tip = append(tip, fmt.Sprintf("%d %s", n, p.Name))
				}
			}
			from := time.Duration(int64(i)*s.StepMS) * time.Millisecond
			fmt.Fprintf(w, `<g><title>%s, %s–%s: %s</title>`, html.EscapeString(r.Label), Offset(from), Offset(from+time.Duration(s.StepMS)*time.Millisecond), html.EscapeString(strings.Join(tip, ", ")))
			base := float64(y + h)
			for _, p := range r.Parts {
				n := countAt(p, i)
				if n == 0 {
					continue
				}
				// A bar of any count is at least a pixel tall, so a lone event shows.
				ph := max(float64(h)*float64(n)/float64(max(top, total)), 1)
				base -= ph
				fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`, x(i)+0.5, base, max(colW-1, 1), ph, p.Colour)
			}
			fmt.Fprintln(w, `</g>`)
		}
		y += h + 4
	}
	// The axis: a label every few steps, as an offset from the run's start.
	every := max(1, steps/12)
	for i := 0; i <= steps; i += every {
		fmt.Fprintf(w, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#bbb"/>`, x(i), x(i), y, y+4)
		fmt.Fprintf(w, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x(i), y+16, Offset(time.Duration(int64(i)*s.StepMS)*time.Millisecond))
	}
	_, err := fmt.Fprintln(w, `</svg>`)
	return err
}

func countAt(p Part, i int) int64 {
	if i < len(p.Counts) {
		return p.Counts[i]
	}
	return 0
}

func stackAt(r Row, i int) int64 {
	var n int64
	for _, p := range r.Parts {
		n += countAt(p, i)
	}
	return n
}

// Offset formats a time since a run's start as +h:mm:ss (+m:ss under an hour), tenths kept
// under a minute's precision.
func Offset(d time.Duration) string {
	d = d.Round(100 * time.Millisecond)
	h, m := int(d/time.Hour), int(d%time.Hour/time.Minute)
	sec := float64(d%time.Minute) / float64(time.Second)
	f := "%04.1f"
	if d%time.Second == 0 {
		f = "%02.0f"
	}
	if h > 0 {
		return fmt.Sprintf("+%d:%02d:"+f, h, m, sec)
	}
	return fmt.Sprintf("+%d:"+f, m, sec)
}
