package chaos

import (
	"bytes"
	"context"
	"fmt"
	"html"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/batonhq/baton/internal/operator/timeline"
)

// Report layout: how many partitions a lane file draws, and how many steps the summary's time
// axis has at most.
const (
	reportGroup = 16
	reportSteps = 120
)

// Report files, in the directory WriteReport writes.
const (
	ReportIndex   = "index.html"
	ReportSummary = "summary.svg"
	ReportFaults  = "faults.html"
)

// WriteReport writes the run's report into dir (created if missing), readable at any size: a
// thousand faults over hundreds of partitions and hours still open at a glance.
//
//   - index.html: the verdict, a summary drawing (faults started per step and kind, proven or
//     not; faults in flight; zombie writes refused, aborted or committed; writes refused as stale
//     and failed; records applied, the backlog, the apply lag and workers committing), and links
//     to the rest; a run of at most 16 partitions has its one lane file drawn there too.
//     Self-contained: no script, no network.
//
// The backlog is, at each step's end, the records the harness's producer had acknowledged
// minus those applied (of the topics it produced; drawn when the run counted them). The apply
// lag is, per step, the largest of its committed batches' lags: the commit's time minus the
// Kafka timestamp of the batch's oldest record. A stalled partition adds to the backlog while
// it stalls; its lag shows in the step its backlog commits.
//   - summary.svg: the summary drawing on its own.
//   - lanes-NN.svg: the timeline of up to 16 partitions each (batches coloured by token, refused
//     writes, freezes), under a strip of the faults, each linked to its row of faults.html.
//   - faults.html: every fault with its kind, target, start, duration, whether it was proven
//     and its detail.
//
// What it draws comes from r and the run's database, as for [WriteTimeline].
func WriteReport(ctx context.Context, dir string, db DB, r *Result) error {
	d, err := readRun(ctx, db)
	if err != nil {
		return err
	}
	return writeReport(dir, r, d)
}

func writeReport(dir string, r *Result, d runData) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	lanes := d.lanes()
	var groups [][]lane
	for len(lanes) > 0 {
		n := min(reportGroup, len(lanes))
		groups = append(groups, lanes[:n])
		lanes = lanes[n:]
	}
	all := d.lanes()
	multi := len(all) > 0 && all[0].topic != all[len(all)-1].topic
	type laneFile struct {
		name, label    string
		batches, marks int
	}
	var files []laneFile
	var only []byte // the lane file of a run with one, drawn in the index too
	for i, g := range groups {
		t := d.timeline(r, g)
		label := g[0].label(multi)
		if len(g) > 1 {
			label = "partitions " + strings.TrimPrefix(label, "partition ") + " to " + strings.TrimPrefix(g[len(g)-1].label(multi), "partition ")
		}
		t.Title = fmt.Sprintf("Baton chaos run: mode %s, %s (%d of %d lanes)", r.Config.Mode, label, len(g), len(all))
		t.BandStrip = true
		// Every lane file carries every fault, so a tooltip keeps its first 240 bytes; the
		// fault list has the whole detail.
		for j, f := range r.Faults {
			t.Bands = append(t.Bands, timeline.Band{StartMS: f.Start.UnixMilli(), EndMS: f.End.UnixMilli(),
				Label: clip(string(f.Kind)+" "+f.Target+" — "+f.Detail, 240), Href: fmt.Sprintf("%s#f%d", ReportFaults, j+1)})
		}
		f := laneFile{name: fmt.Sprintf("lanes-%02d.svg", i+1), label: label, batches: len(t.Batches), marks: len(t.Marks)}
		var b bytes.Buffer
		if err := timeline.Write(&b, t); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, f.name), b.Bytes(), 0o644); err != nil {
			return err
		}
		files = append(files, f)
		if len(groups) == 1 {
			only = b.Bytes()
		}
	}
	var sum bytes.Buffer
	if err := timeline.WriteSummary(&sum, summarize(r, d)); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, ReportSummary), sum.Bytes(), 0o644); err != nil {
		return err
	}
	var faults bytes.Buffer
	writeFaultTable(&faults, r)
	if err := os.WriteFile(filepath.Join(dir, ReportFaults), faults.Bytes(), 0o644); err != nil {
		return err
	}

	var b bytes.Buffer
	verdict, colour := "PASS", "#2e7d32"
	if !r.OK() {
		verdict, colour = "FAIL", "#c62828"
	}
	title := fmt.Sprintf("Baton chaos run: mode %s", r.Config.Mode)
	fmt.Fprintf(&b, "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>%s: %s</title>\n%s</head><body>\n", html.EscapeString(title), verdict, reportStyle)
	fmt.Fprintf(&b, "<h1>%s: <span style=\"color:%s\">%s</span></h1>\n", html.EscapeString(title), colour, verdict)
	fmt.Fprintf(&b, "<p>Started %s, ran %s; %d faults, %d lanes, %d workers, seed %d.</p>\n",
		r.Started.UTC().Format("2006-01-02 15:04:05 UTC"), r.Finished.Sub(r.Started).Round(time.Second), len(r.Faults), len(all), r.Config.Workers, r.Config.Seed)
	b.Write(sum.Bytes())
	b.WriteString("<h2>Verdict</h2>\n<pre>")
	var v strings.Builder
	WriteVerdict(&v, r)
	b.WriteString(html.EscapeString(v.String()))
	b.WriteString("</pre>\n<h2>Lanes</h2>\n<p>Each file draws up to 16 partitions over the whole run: ticks are committed batches coloured by the writer's token, red crosses refused writes (ringed when a frozen zombie made them). The bars above the lanes are the faults: point at one for its detail, click it for its row in the fault list.</p>\n<ul>\n")
	for _, f := range files {
		fmt.Fprintf(&b, "<li><a href=\"%s\">%s</a>: %d batches, %d writes not committed</li>\n", f.name, html.EscapeString(f.label), f.batches, f.marks)
	}
	b.WriteString("</ul>\n")
	b.Write(only)
	fmt.Fprintf(&b, "<h2>Faults</h2>\n<p><a href=\"%s\">All %d faults</a>: kind, target, start, duration, whether proven, detail.</p>\n</body></html>\n", ReportFaults, len(r.Faults))
	return os.WriteFile(filepath.Join(dir, ReportIndex), b.Bytes(), 0o644)
}

const reportStyle = `<style>
body { font-family: sans-serif; margin: 1em 2em; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: left; vertical-align: top; }
tr:target { background: #fff3c4; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
</style>
`

// writeFaultTable writes faults.html: one row per fault, anchored #fN for the lane files' links.
func writeFaultTable(b *bytes.Buffer, r *Result) {
	fmt.Fprintf(b, "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>Faults of the chaos run (mode %s)</title>\n%s</head><body>\n", r.Config.Mode, reportStyle)
	fmt.Fprintf(b, "<h1>Faults of the chaos run (mode %s)</h1>\n<p><a href=\"%s\">Back to the report</a>. Start is the time since the run started (%s); a proven fault provably happened (e.g. the frozen worker's takeover was seen).</p>\n",
		r.Config.Mode, ReportIndex, r.Started.UTC().Format("2006-01-02 15:04:05 UTC"))
	b.WriteString("<table>\n<tr><th>#</th><th>kind</th><th>target</th><th>start</th><th>duration</th><th>proven</th><th>detail</th></tr>\n")
	for i, f := range r.Faults {
		proven := "no"
		if f.Bit {
			proven = "yes"
		}
		fmt.Fprintf(b, "<tr id=\"f%d\"><td class=\"n\">%d</td><td>%s</td><td>%s</td><td class=\"n\">%s</td><td class=\"n\">%s</td><td>%s</td><td>%s</td></tr>\n",
			i+1, i+1, html.EscapeString(string(f.Kind)), html.EscapeString(f.Target), timeline.Offset(f.Start.Sub(r.Started)),
			f.End.Sub(f.Start).Round(100*time.Millisecond), proven, html.EscapeString(f.Detail))
	}
	b.WriteString("</table>\n</body></html>\n")
}

// summarize counts the run per step of its time axis.
func summarize(r *Result, d runData) timeline.Summary {
	span := r.Finished.Sub(r.Started)
	step := timeline.Step(span, reportSteps)
	steps := max(1, int((span+step-1)/step))
	from := r.Started
	at := func(t time.Time) int { return min(max(int(t.Sub(from)/step), 0), steps-1) }
	atMS := func(ms int64) int { return at(time.UnixMilli(ms)) }
	per := func() []int64 { return make([]int64, steps) }
	s := timeline.Summary{
		Title: fmt.Sprintf("Baton chaos run: mode %s, %d faults over %s, verdict %s", r.Config.Mode, len(r.Faults),
			span.Round(time.Second), map[bool]string{true: "PASS", false: "FAIL"}[r.OK()]),
		Caption: fmt.Sprintf("One column per %s since the start (%s). Point at a bar for its counts.", stepName(step), from.UTC().Format("15:04:05 UTC")),
		FromMS:  from.UnixMilli(), StepMS: step.Milliseconds(), Steps: steps,
	}

	// Faults started per step, a row per kind: proven dark, unproven light, on one scale.
	type kindRow struct{ proven, unproven []int64 }
	kinds := map[FaultKind]*kindRow{}
	var names []FaultKind
	for _, f := range r.Faults {
		k := kinds[f.Kind]
		if k == nil {
			k = &kindRow{per(), per()}
			kinds[f.Kind] = k
			names = append(names, f.Kind)
		}
		if f.Bit {
			k.proven[at(f.Start)]++
		} else {
			k.unproven[at(f.Start)]++
		}
	}
	slices.Sort(names)
	var most int64
	for _, k := range kinds {
		for i := range k.proven {
			most = max(most, k.proven[i]+k.unproven[i])
		}
	}
	// Many kinds get thinner rows, so the drawing stays a screen tall.
	kh := min(14, max(8, 360/max(len(names), 1)))
	for i, n := range names {
		k := kinds[n]
		var p, u int64
		for j := range k.proven {
			p, u = p+k.proven[j], u+k.unproven[j]
		}
		row := timeline.Row{Label: string(n), Note: fmt.Sprintf("%d (%d proven)", p+u, p), Height: kh, Max: most,
			Parts: []timeline.Part{{Name: "proven", Colour: "#1f5f99", Counts: k.proven}, {Name: "not proven", Colour: "#9cc3e6", Counts: k.unproven}}}
		if i == 0 {
			row.Heading = "Faults started, by kind (dark: proven)"
		}
		s.Rows = append(s.Rows, row)
	}

	// Faults in flight: the most at any instant of each step, exact from the intervals.
	flight := inFlight(r.Faults, from, step, steps)
	s.Rows = append(s.Rows, timeline.Row{Heading: "The run", Label: "faults in flight (most)", Note: fmt.Sprintf("at most %d at once", slices.Max(append(flight, 0))),
		Height: 36, Parts: []timeline.Part{{Name: "in flight at once", Colour: "#e0a526", Counts: flight}}})

	// Writes that did not commit, and zombies' writes by how they ended (as the checker counts them).
	refused, aborted, committed, stale, failed := per(), per(), per(), per(), per()
	var nRefused, nAborted, nCommitted, nStale, nFailed int64
	for _, a := range d.attempts {
		i := atMS(a.atMS)
		if a.zombie {
			switch a.outcome {
			case OutcomeStale:
				refused[i]++
				nRefused++
			case OutcomeCommitted:
				committed[i]++
				nCommitted++
			default:
				aborted[i]++
				nAborted++
			}
		}
		switch a.outcome {
		case OutcomeStale:
			stale[i]++
			nStale++
		case OutcomeError:
			failed[i]++
			nFailed++
		}
	}
	s.Rows = append(s.Rows,
		timeline.Row{Label: "zombie writes", Note: fmt.Sprintf("%d refused, %d aborted, %d committed", nRefused, nAborted, nCommitted), Height: 36,
			Parts: []timeline.Part{{Name: "refused by the fence", Colour: "#2e7d32", Counts: refused}, {Name: "aborted by the database", Colour: "#8d8d8d", Counts: aborted}, {Name: "committed", Colour: "#d62728", Counts: committed}}},
		timeline.Row{Label: "writes refused as stale", Note: fmt.Sprintf("%d", nStale), Height: 36,
			Parts: []timeline.Part{{Name: "refused as stale", Colour: "#59a14f", Counts: stale}}},
		timeline.Row{Label: "writes failed (errors)", Note: fmt.Sprintf("%d", nFailed), Height: 24,
			Parts: []timeline.Part{{Name: "failed", Colour: "#b07aa1", Counts: failed}}})

	// Progress: records applied; the backlog, what the harness's producer had acknowledged
	// and was not applied yet; and the apply lag. A stalled partition adds to the backlog while
	// it stalls, and its lag shows when its backlog commits.
	recs, writers, lag := per(), per(), per()
	var nRecs int64
	var lagSteps []int64            // the lag of each step with a batch whose production is known
	lagKnown := make([]bool, steps) // the step has such a batch
	input := per()                  // records applied of the topics the harness produced
	wrote := map[string][]bool{}    // per worker, the steps it committed in
	for _, b := range d.applied {
		i := atMS(b.atMS)
		recs[i] += b.records
		nRecs += b.records
		if wrote[b.who] == nil {
			wrote[b.who] = make([]bool, steps)
		}
		if !wrote[b.who][i] {
			wrote[b.who][i] = true
			writers[i]++
		}
		if b.producedMS > 0 {
			lag[i] = max(lag[i], b.atMS-b.producedMS)
			lagKnown[i] = true
		}
		if _, ok := r.acked[b.topic]; ok {
			input[i] += b.records
		}
	}
	for i, known := range lagKnown {
		if known {
			lagSteps = append(lagSteps, lag[i])
		}
	}
	s.Rows = append(s.Rows, timeline.Row{Heading: "Progress (a stalled partition adds to the backlog while it stalls, and shows as apply lag in the step its backlog commits)",
		Label: "records applied", Note: fmt.Sprintf("%d", nRecs), Height: 36,
		Parts: []timeline.Part{{Name: "records applied", Colour: "#4e79a7", Counts: recs}}})
	if r.acked != nil {
		// At each step's end: acknowledged so far minus applied so far. A record applied
		// twice (the baselines) counts twice, so the backlog never reads below 0.
		produced := per()
		for _, c := range r.acked {
			for sec, n := range c {
				produced[at(from.Add(time.Duration(sec)*time.Second))] += n
			}
		}
		backlog := per()
		var acked, done, most int64
		for i := range steps {
			acked, done = acked+produced[i], done+input[i]
			backlog[i] = max(acked-done, 0)
			most = max(most, backlog[i])
		}
		s.Rows = append(s.Rows, timeline.Row{Label: "backlog (records)", Note: fmt.Sprintf("at most %d; %d at the end", most, backlog[steps-1]), Height: 30,
			Parts: []timeline.Part{{Name: "records produced and not yet applied at the step's end", Colour: "#f28e2b", Counts: backlog}}})
	}
	note := "not recorded"
	if len(lagSteps) > 0 {
		note = fmt.Sprintf("worst %s; median of steps %s", seconds(slices.Max(lagSteps)), seconds(median(lagSteps)))
	}
	s.Rows = append(s.Rows,
		timeline.Row{Label: "apply lag (largest)", Note: note, Height: 30,
			Parts: []timeline.Part{{Name: "ms", Colour: "#e15759", Counts: lag, Text: func(n int64) string {
				return "largest apply lag " + seconds(n) + " (a batch's commit minus its oldest record's production)"
			}}}},
		timeline.Row{Label: "workers committing", Note: fmt.Sprintf("%d workers in all", len(wrote)), Height: 24,
			Parts: []timeline.Part{{Name: "workers that committed in the step", Colour: "#76b7b2", Counts: writers}}})
	return s
}

// seconds says a duration in milliseconds in seconds: 0.25 s, 12.3 s.
func seconds(ms int64) string {
	if ms < 10_000 {
		return fmt.Sprintf("%.2f s", float64(ms)/1000)
	}
	return fmt.Sprintf("%.1f s", float64(ms)/1000)
}

// median returns the median of ns (the mean of the middle two of an even count).
func median(ns []int64) int64 {
	s := slices.Sorted(slices.Values(ns))
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// inFlight returns, per step, the most faults in flight at any one instant of it: a sweep over
// the faults' starts and ends (a fault is in flight from its Start to its End).
func inFlight(faults []Fault, from time.Time, step time.Duration, steps int) []int64 {
	type event struct {
		at    time.Time
		delta int64
	}
	var ev []event
	for _, f := range faults {
		end := f.End
		if !end.After(f.Start) {
			end = f.Start.Add(time.Nanosecond) // an instant's fault is in flight at its instant
		}
		ev = append(ev, event{f.Start, 1}, event{end, -1})
	}
	// Ends before starts at one instant: a fault that ends as another starts is not in flight with it.
	sort.Slice(ev, func(i, j int) bool {
		return ev[i].at.Before(ev[j].at) || ev[i].at.Equal(ev[j].at) && ev[i].delta < ev[j].delta
	})
	out := make([]int64, steps)
	var cur int64
	i := 0
	for s := range steps {
		begin := from.Add(time.Duration(s) * step)
		// What is in flight just after the step begins counts in it: what ended at its first
		// instant does not.
		for ; i < len(ev) && !ev[i].at.After(begin); i++ {
			cur += ev[i].delta
		}
		out[s] = cur
		for ; i < len(ev) && (ev[i].at.Before(begin.Add(step)) || s == steps-1); i++ {
			cur += ev[i].delta
			out[s] = max(out[s], cur)
		}
	}
	return out
}

// stepName says a step in words: "minute", "10 seconds".
func stepName(d time.Duration) string {
	switch {
	case d == time.Second:
		return "second"
	case d == time.Minute:
		return "minute"
	case d == time.Hour:
		return "hour"
	case d%time.Hour == 0:
		return fmt.Sprintf("%d hours", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%d minutes", d/time.Minute)
	}
	return fmt.Sprintf("%d seconds", d/time.Second)
}
