package bench

import (
	"context"
	"errors"
	"fmt"
	"html"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// ScaleConfig is one 'baton bench scale' run: the bench at a default point, then at other
// points that vary one axis each (partitions, keys, record size) from it.
type ScaleConfig struct {
	// Config gives the services, the designs (default: ScaleDesigns), the ceiling's
	// connection counts, Timeout, Self, Progress, Out and Command; Records, Keys,
	// Partitions and Size are the default point.
	Config
	AxisPartitions, AxisKeys, AxisSizes []int // the values of each axis (the default point's is skipped)
	// MaxBytes bounds a point's topic: a point of larger records has fewer of them (never
	// fewer than one per key).
	MaxBytes int64
}

// ScaleDesigns are the designs a scale run measures by default: Baton's fast path, the
// database's ceiling and the broker's.
var ScaleDesigns = []string{Reference, "ceiling", KafkaReadDesign}

// ScalePoint is one point of a scale run.
type ScalePoint struct {
	Axis                            string // "partitions", "keys", "size", or "" for the default point
	Records, Keys, Partitions, Size int
}

func (p ScalePoint) value() string {
	switch p.Axis {
	case "partitions":
		return fmt.Sprint(p.Partitions)
	case "keys":
		return fmt.Sprint(p.Keys)
	case "size":
		return sizeString(p.Size)
	}
	return "default"
}

func sizeString(n int) string {
	if n >= 1024 && n%1024 == 0 {
		return fmt.Sprintf("%d KiB", n/1024)
	}
	return fmt.Sprintf("%d B", n)
}

// ScaleResult is one point: a row per design (the ceiling's best connection count only).
type ScaleResult struct {
	Point   ScalePoint
	Rows    []Row
	Elapsed time.Duration
	Err     error
}

// Points returns the run's points: the default one first, then each axis's other values.
func (cfg *ScaleConfig) Points() []ScalePoint {
	def := ScalePoint{Records: cfg.Records, Keys: cfg.Keys, Partitions: cfg.Partitions, Size: cfg.Size}
	out := []ScalePoint{cfg.sized(def)}
	add := func(axis string, values []int, set func(*ScalePoint, int), is func(ScalePoint) int) {
		for _, v := range values {
			if v == is(def) {
				continue
			}
			p := def
			p.Axis = axis
			set(&p, v)
			out = append(out, cfg.sized(p))
		}
	}
	add("partitions", cfg.AxisPartitions, func(p *ScalePoint, v int) { p.Partitions = v }, func(p ScalePoint) int { return p.Partitions })
	add("keys", cfg.AxisKeys, func(p *ScalePoint, v int) { p.Keys = v }, func(p ScalePoint) int { return p.Keys })
	add("size", cfg.AxisSizes, func(p *ScalePoint, v int) { p.Size = v }, func(p ScalePoint) int { return p.Size })
	return out
}

// sized bounds p's records by MaxBytes, keeps at least one per key, and rounds them to whole
// records per key.
func (cfg *ScaleConfig) sized(p ScalePoint) ScalePoint {
	if cfg.MaxBytes > 0 && p.Size > 0 {
		p.Records = int(min(int64(p.Records), cfg.MaxBytes/int64(p.Size)))
	}
	p.Records = max(p.Records, p.Keys) / p.Keys * p.Keys
	return p
}

// RunScale runs the bench at every point, every run's fold checked, and writes the summary.
// It fails if any run failed or was wrong.
func RunScale(ctx context.Context, cfg ScaleConfig) ([]ScaleResult, error) {
	if len(cfg.Designs) == 0 {
		cfg.Designs = ScaleDesigns
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var errs []error
	for _, vs := range [][]int{cfg.AxisPartitions, cfg.AxisKeys, cfg.AxisSizes} {
		if slices.ContainsFunc(vs, func(v int) bool { return v < 1 }) {
			errs = append(errs, fmt.Errorf("axis values %v: want each >= 1", vs))
		}
	}
	for _, d := range cfg.designs() {
		if d.Slow || d.Peer {
			errs = append(errs, fmt.Errorf("design %s: a scale run takes the designs that run on the main topic", d.Name))
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrUsage, errors.Join(errs...))
	}
	out := cfg.Progress
	load0 := LoadAvg()
	t0 := time.Now()
	var results []ScaleResult
	var last time.Time
	for _, p := range cfg.Points() {
		for time.Now().Unix() == last.Unix() { // Run names its schema and topics by the second
			time.Sleep(50 * time.Millisecond)
		}
		last = time.Now()
		c := cfg.Config
		c.Records, c.Keys, c.Partitions, c.Size = p.Records, p.Keys, p.Partitions, p.Size
		c.Rounds, c.Out = 1, ""
		fmt.Fprintf(out, "\n== point %s %s: %d records, %d keys, %d partitions, records of %s\n", p.Axis, p.value(), p.Records, p.Keys, p.Partitions, sizeString(p.Size))
		start := time.Now()
		rs, err := Run(ctx, c)
		res := ScaleResult{Point: p, Rows: bestCeiling(Summarize(rs)), Elapsed: time.Since(start), Err: err}
		results = append(results, res)
		if err != nil {
			errs = append(errs, fmt.Errorf("point %s %s: %w", p.Axis, p.value(), err))
			if ctx.Err() != nil {
				return results, errors.Join(errs...)
			}
		}
	}
	conds := Conditions{Start: load0, End: LoadAvg(), CPUs: runtime.NumCPU(), Go: runtime.Version(), Date: time.Now().UTC(),
		Rounds: 1, Command: cfg.Command}
	fmt.Fprintf(out, "\nscale run: %d points in %s\n\n", len(results), time.Since(t0).Round(time.Second))
	WriteScaleTable(out, results, conds, time.Since(t0))
	if cfg.Out != "" {
		if err := writeScale(cfg.Out, results, conds, time.Since(t0)); err != nil {
			return results, err
		}
		fmt.Fprintf(out, "\nwrote %s and %s\n", filepath.Join(cfg.Out, "SCALE.md"), filepath.Join(cfg.Out, "scale.svg"))
	}
	return results, errors.Join(errs...)
}

// bestCeiling keeps, of the ceiling's rows, the fastest, named "ceiling".
func bestCeiling(rows []Row) []Row {
	var out []Row
	best := -1
	for _, r := range rows {
		if !strings.HasPrefix(r.Design, "ceiling/") {
			out = append(out, r)
			continue
		}
		r.Design = "ceiling"
		if best < 0 {
			out = append(out, r)
			best = len(out) - 1
			continue
		}
		if r.OK > 0 && (out[best].OK == 0 || r.Rate > out[best].Rate) {
			out[best] = r
		}
	}
	return out
}

// WriteScaleTable writes the points as a Markdown table, with the conditions above it.
func WriteScaleTable(w io.Writer, results []ScaleResult, c Conditions, took time.Duration) {
	fmt.Fprintf(w, "%s, %s, %d CPUs; load average %s at the start, %s at the end; the run took %s\n",
		c.Date.Format("2006-01-02 15:04 UTC"), c.Go, c.CPUs, c.Start, c.End, took.Round(time.Second))
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| axis | value | records | keys | partitions | record | design | records/s | first commit s | p99 ms | RSS MiB | vs ceiling |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|")
	for _, res := range results {
		p := res.Point
		axis := p.Axis
		if axis == "" {
			axis = "(all defaults)"
		}
		if len(res.Rows) == 0 {
			fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %s | - | did not run: %s | | | | |\n", axis, p.value(), p.Records, p.Keys, p.Partitions, sizeString(p.Size), strings.ReplaceAll(firstLine(fmt.Sprint(res.Err)), "|", "/"))
			continue
		}
		for _, r := range res.Rows {
			if r.OK == 0 {
				fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %s | %s | did not count: %s | | | | |\n", axis, p.value(), p.Records, p.Keys, p.Partitions, sizeString(p.Size), r.Design, strings.ReplaceAll(r.FirstError, "|", "/"))
				continue
			}
			fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %s | %s | %.0f | %.2f | %.1f | %d | %s |\n", axis, p.value(), p.Records, p.Keys, p.Partitions, sizeString(p.Size),
				r.Design, r.Rate, r.First.Seconds(), ms(r.P99), r.RSS>>20, ratio(r.VsCeiling))
		}
	}
}

func writeScale(dir string, results []ScaleResult, c Conditions, took time.Duration) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("# How cost grows\n\nGenerated by `baton bench scale -out DIR`; do not edit by hand.")
	if c.Command != "" {
		fmt.Fprintf(&b, " This run: `%s`.", c.Command)
	}
	b.WriteString("\n\n")
	WriteScaleTable(&b, results, c, took)
	b.WriteString("\n![records/s per point](scale.svg)\n")
	b.WriteString(scaleNotes)
	if err := os.WriteFile(filepath.Join(dir, "SCALE.md"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "scale.svg"))
	if err != nil {
		return err
	}
	WriteScaleChart(f, results, c)
	return f.Close()
}

const scaleNotes = `
## Reading the table

- Each point is one ` + "`baton bench`" + ` run (one round) of the designs on a topic of its own, every
  fold checked; one axis varies at a time from the default point (the first row). Records per
  point are kept modest (bounded in bytes for large records, never fewer than one per key), so
  a point's **records/s** includes its start: **first commit s** (joining, claiming every
  partition, the first fetch) weighs more where there are many partitions and few records
  per partition.
- **p99** is of one transaction (a batch for baton-fast, a 1000-record chunk for the ceiling,
  a poll for kafka-read); **RSS** is the worker's peak. The ceiling is the best of its
  connection counts at that point.
- **record** is a record's key, value and headers; the padding rides in a header no design
  reads, and the fold stores no payload: the size axis prices moving bytes through Kafka (the
  broker, the fetch, the client's decoding and buffers), which the database ceiling, reading
  no Kafka, does not pay (it is flat there by construction; kafka-read is the comparison).
- Keys: more distinct keys mean fewer records merged per key in a batch, so more rows per
  statement and a larger table and index; at one record per key nothing merges.
`

// WriteScaleChart writes one panel per axis: records/s per design at each value, as
// horizontal bars (the style of WriteChart).
func WriteScaleChart(w io.Writer, results []ScaleResult, c Conditions) {
	const left, barH, gap, width, groupGap = 170, 14, 2, 520, 10
	var top float64
	var designs []string
	for _, res := range results {
		for _, r := range res.Rows {
			top = max(top, r.Rate)
			if !slices.Contains(designs, r.Design) {
				designs = append(designs, r.Design)
			}
		}
	}
	if top == 0 {
		top = 1
	}
	var def *ScaleResult
	for i := range results {
		if results[i].Point.Axis == "" {
			def = &results[i]
		}
	}
	type panel struct {
		title string
		res   []ScaleResult
	}
	var panels []panel
	for _, axis := range []string{"partitions", "keys", "size"} {
		var rs []ScaleResult
		if def != nil {
			rs = append(rs, *def)
		}
		for _, res := range results {
			if res.Point.Axis == axis {
				rs = append(rs, res)
			}
		}
		slices.SortStableFunc(rs, func(a, b ScaleResult) int { return axisValue(a.Point, axis) - axisValue(b.Point, axis) })
		if len(rs) > 1 {
			panels = append(panels, panel{axis, rs})
		}
	}
	h := 60
	for _, p := range panels {
		h += 28 + len(p.res)*(len(designs)*(barH+gap)+groupGap)
	}
	h += 20
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", left+width+110, h)
	fmt.Fprintln(w, `<rect width="100%" height="100%" fill="white"/>`)
	fmt.Fprintln(w, `<text x="10" y="20" font-size="14" font-weight="bold">records/s as one axis grows (fold checked; the others at the default point)</text>`)
	fmt.Fprintf(w, `<text x="10" y="38" fill="#555">%s, %d CPUs, load %s to %s; one round per point</text>`+"\n",
		html.EscapeString(c.Date.Format("2006-01-02")), c.CPUs, html.EscapeString(c.Start), html.EscapeString(c.End))
	x := 10
	for i, d := range designs {
		fmt.Fprintf(w, `<rect x="%d" y="46" width="10" height="10" fill="%s"/><text x="%d" y="55">%s</text>`+"\n", x, designColor(d), x+14, html.EscapeString(d))
		x += 24 + 8*len(d) + i
	}
	y := 60
	for _, p := range panels {
		y += 22
		fmt.Fprintf(w, `<text x="10" y="%d" font-weight="bold">%s</text>`+"\n", y, p.title)
		y += 6
		for _, res := range p.res {
			label := axisLabel(res.Point, p.title)
			gy := y
			for _, d := range designs {
				var row *Row
				for i := range res.Rows {
					if res.Rows[i].Design == d {
						row = &res.Rows[i]
					}
				}
				wd, text := 0, "-"
				if row != nil && row.OK > 0 {
					wd, text = int(float64(width)*row.Rate/top), fmt.Sprintf("%.0f", row.Rate)
				} else if row != nil {
					text = "did not count"
				}
				fmt.Fprintf(w, `<rect x="%d" y="%d" width="%d" height="%d" fill="%s"/>`+"\n", left, y, wd, barH, designColor(d))
				fmt.Fprintf(w, `<text x="%d" y="%d" font-size="10">%s</text>`+"\n", left+wd+4, y+barH-3, text)
				y += barH + gap
			}
			fmt.Fprintf(w, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", left-8, gy+(y-gy)/2+4, html.EscapeString(label))
			y += groupGap
		}
	}
	fmt.Fprintln(w, "</svg>")
}

func axisValue(p ScalePoint, axis string) int {
	switch axis {
	case "partitions":
		return p.Partitions
	case "keys":
		return p.Keys
	}
	return p.Size
}

func axisLabel(p ScalePoint, axis string) string {
	switch axis {
	case "partitions":
		return fmt.Sprintf("%d partitions", p.Partitions)
	case "keys":
		return fmt.Sprintf("%d keys", p.Keys)
	}
	return sizeString(p.Size) + " records"
}

func designColor(d string) string {
	switch {
	case strings.HasPrefix(d, "ceiling"), d == SQLiteCeiling:
		return "#3a9d5d"
	case d == KafkaReadDesign:
		return "#8cc9a0"
	case strings.HasPrefix(d, "baton"), strings.HasPrefix(d, "sqlite-"), strings.HasPrefix(d, "redis-"):
		return "#2f6fdf"
	}
	return "#9aa5b1"
}
