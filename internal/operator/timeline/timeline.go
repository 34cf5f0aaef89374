package timeline

import (
	"fmt"
	"html"
	"io"
	"sort"
)

// Batch is a committed batch (or, on the live page, the commits observed between two reads).
type Batch struct {
	Lane  int32 // the partition
	AtMS  int64 // Unix milliseconds
	Era   int64
	Epoch int64
	Who   string // the writer
	Count int    // how many batches this tick stands for; 0 means 1
}

// Mark is a write that did not commit: refused (a red cross) or frozen (a snowflake).
type Mark struct {
	Lane    int32
	AtMS    int64
	Who     string
	Outcome string // what happened, e.g. "stale"
	Token   string // era.epoch the writer held
	Frozen  bool   // a freeze marker, not a refusal
	Zombie  bool   // made by a frozen zombie: ringed
}

// Band is a labelled time span, e.g. an injected fault or a takeover.
type Band struct {
	StartMS, EndMS int64
	Label          string
	Href           string // with BandStrip: where the band's bar links to (none if empty)
}

// Timeline is what Write draws.
type Timeline struct {
	Title      string
	Caption    string
	Lanes      int // partitions 0..Lanes-1
	FromMS     int64
	ToMS       int64
	LaneLabels []string // optional, per lane; default "partition N"
	Batches    []Batch
	Marks      []Mark
	Bands      []Band
	// BandStrip draws the bands as numbered bars in a strip above the lanes, each labelled by
	// its tooltip, instead of shading the lanes and listing every label under them: a run of a
	// thousand faults stays one screen tall. Overlapping bands stack in up to eight rows.
	BandStrip bool
}

// DefaultCaption explains the drawing.
const DefaultCaption = "Each lane is a partition; ticks are committed batches coloured by the writer's token (era.epoch); red crosses are refused writes, ringed when a frozen zombie made them."

// laneLabelRunes is how many characters of a lane's label fit its column.
const laneLabelRunes = 14

// stripRows is how many rows of bars the band strip stacks overlapping bands in; a band that
// finds no free row is drawn over the row that frees first.
const stripRows = 8

// Write writes t as one SVG document.
func Write(w io.Writer, t Timeline) error {
	t0, t1 := t.FromMS, t.ToMS
	if t1 <= t0 {
		t1 = t0 + 1
	}
	parts := t.Lanes
	const left, laneH, width = 90, 22, 1100
	top, listed := 60, len(t.Bands)
	var row []int // with BandStrip, each band's row in the strip
	if t.BandStrip && len(t.Bands) > 0 {
		var rows int
		row, rows = stack(t.Bands)
		top, listed = 60+6*rows+8, 0
	}
	height := top + parts*laneH + 40 + 18*listed
	x := func(ms int64) float64 { return left + float64(ms-t0)/float64(t1-t0)*float64(width-left-20) }
	y := func(p int32) int { return top + int(p)*laneH }
	palette := []string{"#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#bab0ac", "#e15759", "#ff9da7"}
	colour := map[string]string{}
	tokColour := func(era, epoch int64) string {
		k := fmt.Sprintf("%d.%d", era, epoch)
		if c, ok := colour[k]; ok {
			return c
		}
		c := palette[len(colour)%len(palette)]
		colour[k] = c
		return c
	}
	caption := t.Caption
	if caption == "" {
		caption = DefaultCaption
	}
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", width, height)
	fmt.Fprintf(w, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(w, `<text x="10" y="20" font-size="14" font-weight="bold">%s</text>`+"\n", html.EscapeString(t.Title))
	fmt.Fprintf(w, `<text x="10" y="38">%s</text>`+"\n", html.EscapeString(caption))
	if row != nil {
		fmt.Fprintln(w, `<text x="10" y="58">faults</text>`)
	}
	for i, b := range t.Bands {
		fx0, fx1 := x(b.StartMS), x(b.EndMS)
		if fx1-fx0 < 2 {
			fx1 = fx0 + 2
		}
		if row != nil {
			bar := fmt.Sprintf(`<rect x="%.1f" y="%d" width="%.1f" height="5" fill="#e0a526"><title>%d: %s</title></rect>`, fx0, 52+6*row[i], fx1-fx0, i+1, html.EscapeString(b.Label))
			if b.Href != "" {
				bar = `<a href="` + html.EscapeString(b.Href) + `">` + bar + `</a>`
			}
			fmt.Fprintln(w, bar)
			continue
		}
		fmt.Fprintf(w, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="#f2c14e" opacity="0.25"/>`+"\n", fx0, top-8, fx1-fx0, parts*laneH+8)
		// A band in the right half has its label end at the band, so it stays on the canvas.
		tx, anchor := fx0, "start"
		if fx0 > width/2 {
			tx, anchor = fx1, "end"
		}
		fmt.Fprintf(w, `<text x="%.1f" y="%d" text-anchor="%s">%d: %s</text>`+"\n", tx, top+parts*laneH+20+18*i, anchor, i+1, html.EscapeString(b.Label))
	}
	for p := 0; p < parts; p++ {
		label := fmt.Sprintf("partition %d", p)
		if p < len(t.LaneLabels) && t.LaneLabels[p] != "" {
			label = t.LaneLabels[p]
		}
		// A label wider than the label column keeps its end (the partition), the whole of it
		// a tooltip.
		text := html.EscapeString(label)
		if r := []rune(label); len(r) > laneLabelRunes {
			text = "<title>" + text + "</title>…" + html.EscapeString(string(r[len(r)-laneLabelRunes+1:]))
		}
		fmt.Fprintf(w, `<text x="10" y="%d">%s</text>`+"\n", y(int32(p))+12, text)
		fmt.Fprintf(w, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#ddd"/>`+"\n", left, width-20, y(int32(p))+laneH/2, y(int32(p))+laneH/2)
	}
	// One tick per partition per pixel column, coloured by the last token committed in it, so a
	// soak of a million batches still draws a timeline of a few thousand ticks; ticks of one
	// writer under one token that touch (a tick is two columns wide) are one tick.
	type bucket struct {
		part int32
		col  int
	}
	type tick struct {
		bucket
		last  Batch
		count int
		to    int // the last column it covers
	}
	var ticks []*tick
	open := map[int32]*tick{} // each lane's latest tick
	at := map[bucket]*tick{}
	for _, b := range t.Batches {
		k := bucket{b.Lane, int(x(b.AtMS))}
		c := at[k]
		if c == nil {
			if o := open[b.Lane]; o != nil && o.to < k.col && k.col <= o.to+2 && o.last.Who == b.Who && o.last.Era == b.Era && o.last.Epoch == b.Epoch {
				c = o
				c.to = k.col
			} else {
				c = &tick{bucket: k, to: k.col}
				ticks = append(ticks, c)
			}
			at[k] = c
			if o := open[b.Lane]; o == nil || o.to <= c.to {
				open[b.Lane] = c
			}
		}
		c.last = b
		c.count += max(b.Count, 1)
	}
	for _, k := range ticks {
		b := k.last
		fmt.Fprintf(w, `<rect x="%d" y="%d" width="%d" height="%d" fill="%s"><title>%d batches; last by %s, token %d.%d</title></rect>`+"\n",
			k.col, y(b.Lane)+3, k.to-k.col+2, laneH-6, tokColour(b.Era, b.Epoch), k.count, html.EscapeString(b.Who), b.Era, b.Epoch)
	}
	for _, a := range t.Marks {
		if a.Frozen {
			fmt.Fprintf(w, `<text x="%.1f" y="%d" fill="#333"><title>%s froze holding token %s</title>❄</text>`+"\n", x(a.AtMS)-4, y(a.Lane)+15, html.EscapeString(a.Who), html.EscapeString(a.Token))
			continue
		}
		cx, cy := x(a.AtMS), float64(y(a.Lane)+laneH/2)
		fmt.Fprintf(w, `<g stroke="#d62728" stroke-width="2"><title>%s %s with token %s</title><line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/><line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/></g>`+"\n",
			html.EscapeString(a.Who), html.EscapeString(a.Outcome), html.EscapeString(a.Token), cx-4, cy-4, cx+4, cy+4, cx-4, cy+4, cx+4, cy-4)
		if a.Zombie {
			fmt.Fprintf(w, `<circle cx="%.1f" cy="%.1f" r="7" fill="none" stroke="#d62728"/>`+"\n", cx, cy)
		}
	}
	_, err := fmt.Fprintln(w, `</svg>`)
	return err
}

// stack gives each band a row so that bands in one row do not overlap (first fit, in start
// order; past stripRows rows a band shares the row that frees first), and the rows used.
func stack(bands []Band) ([]int, int) {
	order := make([]int, len(bands))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return bands[order[a]].StartMS < bands[order[b]].StartMS })
	row := make([]int, len(bands))
	var ends []int64 // each row's latest end
	for _, i := range order {
		b := bands[i]
		r := -1
		for j, e := range ends {
			if e <= b.StartMS {
				r = j
				break
			}
		}
		if r < 0 && len(ends) < stripRows {
			r = len(ends)
			ends = append(ends, 0)
		}
		if r < 0 {
			r = 0
			for j, e := range ends {
				if e < ends[r] {
					r = j
				}
			}
		}
		row[i] = r
		ends[r] = max(ends[r], b.EndMS)
	}
	return row, len(ends)
}
