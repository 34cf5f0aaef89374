package chaos

import (
	"context"
	"encoding/xml"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/operator/timeline"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// syntheticRun is a run of the given size with no services: faults of a dozen kinds spread
// over span (some overlapping, a third unproven), every partition committing a batch every few
// seconds under a token that changes with takeovers, its records produced up to a few seconds
// earlier (and acknowledged then), and refused, failed and zombie writes.
func syntheticRun(faults, partitions int, span time.Duration) (*Result, runData) {
	rng := rand.New(rand.NewPCG(1, 2))
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	r := &Result{Config: Config{Mode: Fenced, Workers: 3, Seed: 1}, Started: start, Finished: start.Add(span), Settled: true}
	// Every kind the harness has, and room for a third more.
	kinds := slices.Concat(EveryFault, NetFaults)
	for n := len(kinds); len(kinds) < n*4/3; {
		kinds = append(kinds, FaultKind(fmt.Sprintf("kind-%d", len(kinds))))
	}
	for i := range faults {
		at := start.Add(time.Duration(rng.Int64N(int64(span - time.Minute))))
		r.Faults = append(r.Faults, Fault{
			Kind: kinds[i%len(kinds)], Target: fmt.Sprintf("w%d", 1+rng.IntN(40)),
			Detail: fmt.Sprintf("worker frozen %s past its session timeout; takeover seen at offset %d by w%d, its held write refused as stale with token 0.%d",
				time.Duration(rng.Int64N(int64(20*time.Second))).Round(time.Millisecond), rng.Int64N(1e6), 1+rng.IntN(40), rng.IntN(500)),
			Start: at, End: at.Add(time.Duration(rng.Int64N(int64(50 * time.Second)))), Bit: i%3 != 0,
		})
	}
	var d runData
	r.acked = map[string][]int64{"chaos": make([]int64, int(span/time.Second)+1)}
	every := 4 * time.Second
	for p := range partitions {
		epoch := int64(1)
		for at := start.Add(time.Duration(p) * time.Millisecond); at.Before(r.Finished); at = at.Add(every) {
			if rng.IntN(400) == 0 {
				epoch++
				d.attempts = append(d.attempts, writeAttempt{lane: lane{"chaos", int32(p)}, atMS: at.UnixMilli(), who: "w" + strconv.Itoa(rng.IntN(40)),
					outcome: OutcomeStale, zombie: rng.IntN(2) == 0, era: 0, epoch: epoch - 1})
			}
			produced := at.Add(-time.Duration(100+rng.Int64N(3000)) * time.Millisecond)
			if produced.Before(start) {
				produced = start
			}
			b := committedBatch{lane: lane{"chaos", int32(p)}, atMS: at.UnixMilli(), era: 0, epoch: epoch,
				who: "w" + strconv.FormatInt(epoch%40, 10), records: 1 + rng.Int64N(20), producedMS: produced.UnixMilli()}
			d.applied = append(d.applied, b)
			r.acked["chaos"][produced.Sub(start)/time.Second] += b.records
		}
	}
	return r, d
}

// A long run's report stays small: a thousand faults over three hundred partitions and two
// hours give an index under a megabyte, a summary a screen large, and no file over 2 MB; so do
// they over 16 partitions, whose one lane file the index draws as well.
func TestReportSizeBounds(t *testing.T) {
	for _, c := range []struct{ partitions, laneFiles int }{{300, 19}, {16, 1}} {
		t.Run(fmt.Sprintf("%d partitions", c.partitions), func(t *testing.T) {
			r, d := syntheticRun(1000, c.partitions, 2*time.Hour)
			dir := t.TempDir()
			if err := writeReport(dir, r, d); err != nil {
				t.Fatal(err)
			}
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			lanes := 0
			for _, e := range entries {
				fi, err := e.Info()
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("%-14s %8d bytes", e.Name(), fi.Size())
				if fi.Size() >= 2<<20 {
					t.Errorf("%s is %d bytes, want under 2 MB", e.Name(), fi.Size())
				}
				if e.Name() == ReportIndex && fi.Size() >= 1<<20 {
					t.Errorf("%s is %d bytes, want under 1 MB", e.Name(), fi.Size())
				}
				if strings.HasPrefix(e.Name(), "lanes-") {
					lanes++
					wellFormed(t, filepath.Join(dir, e.Name()))
					if w, h := svgSize(t, filepath.Join(dir, e.Name())); w > 1400 || h > 900 {
						t.Errorf("%s is %d × %d px, want at most 1400 × 900", e.Name(), w, h)
					}
				}
			}
			if lanes != c.laneFiles {
				t.Errorf("%d lane files, want %d", lanes, c.laneFiles)
			}
			w, h := svgSize(t, filepath.Join(dir, ReportSummary))
			t.Logf("summary: %d × %d px", w, h)
			if w > 1400 || h > 900 {
				t.Errorf("summary is %d × %d px, want at most 1400 × 900", w, h)
			}
			wellFormed(t, filepath.Join(dir, ReportSummary))
		})
	}
}

// The index links every lane file written, the fault list has every fault once with its fields,
// and text from the run is escaped wherever it appears.
func TestReportStructure(t *testing.T) {
	r, d := syntheticRun(60, 40, 10*time.Minute)
	r.Faults[7].Detail = `held <b>write</b> & "quoted"`
	r.Faults[7].Target = `w<9>`
	r.Faults[8].Detail = strings.Repeat("long detail ", 100) + "end of detail"
	dir := t.TempDir()
	if err := writeReport(dir, r, d); err != nil {
		t.Fatal(err)
	}
	index := read(t, filepath.Join(dir, ReportIndex))
	files, _ := filepath.Glob(filepath.Join(dir, "lanes-*.svg"))
	if len(files) != 3 {
		t.Errorf("%d lane files for 40 partitions, want 3", len(files))
	}
	links := regexp.MustCompile(`href="([^"]+)"`).FindAllStringSubmatch(index, -1)
	linked := map[string]bool{}
	for _, l := range links {
		linked[l[1]] = true
		if _, err := os.Stat(filepath.Join(dir, l[1])); err != nil {
			t.Errorf("index links %s, which is not there", l[1])
		}
	}
	for _, f := range files {
		if !linked[filepath.Base(f)] {
			t.Errorf("index does not link %s", filepath.Base(f))
		}
		wellFormed(t, f)
	}
	if !linked[ReportFaults] {
		t.Errorf("index does not link %s", ReportFaults)
	}
	if !strings.Contains(index, "<svg") || !strings.Contains(index, "<pre>") || !strings.Contains(index, "verdict") {
		t.Errorf("index lacks the summary or the verdict:\n%.2000s", index)
	}
	if strings.Contains(index, "<script") {
		t.Error("index has a script")
	}
	if strings.Count(index, "<svg") != 1 {
		t.Errorf("index of a run of 3 lane files draws %d SVGs, want the summary only", strings.Count(index, "<svg"))
	}

	faults := read(t, filepath.Join(dir, ReportFaults))
	rows := regexp.MustCompile(`<tr id="f(\d+)">`).FindAllStringSubmatch(faults, -1)
	if len(rows) != len(r.Faults) {
		t.Errorf("%d fault rows, want %d", len(rows), len(r.Faults))
	}
	for i, f := range r.Faults {
		if i >= len(rows) || rows[i][1] != strconv.Itoa(i+1) {
			t.Fatalf("fault %d has no row of its own", i+1)
		}
		row := faults[strings.Index(faults, rows[i][0]):]
		row = row[:strings.Index(row, "</tr>")]
		proven := map[bool]string{true: "<td>yes</td>", false: "<td>no</td>"}[f.Bit]
		for _, want := range []string{">" + string(f.Kind) + "<", timeline.Offset(f.Start.Sub(r.Started)), f.End.Sub(f.Start).Round(100 * time.Millisecond).String(), proven} {
			if !strings.Contains(row, want) {
				t.Errorf("fault %d's row lacks %q: %s", i+1, want, row)
			}
		}
	}
	for name, text := range map[string]string{ReportFaults: faults, "lanes-01.svg": read(t, files[0])} {
		if strings.Contains(text, "<b>") || strings.Contains(text, "w<9>") {
			t.Errorf("%s has the fault's text unescaped", name)
		}
		if !strings.Contains(text, "held &lt;b&gt;write&lt;/b&gt; &amp; &#34;quoted&#34;") || !strings.Contains(text, "w&lt;9&gt;") {
			t.Errorf("%s lacks the fault's escaped text", name)
		}
	}
	// A long detail is whole in the fault list, clipped in the lane files' tooltips.
	tip := regexp.MustCompile(`<title>9: ([^<]*)</title>`).FindStringSubmatch(read(t, files[0]))
	if !strings.Contains(faults, "long detail end of detail") || tip == nil || len(tip[1]) > 240+len("…") || !strings.HasSuffix(tip[1], "…") {
		t.Errorf("a long detail is not whole in the fault list and clipped in the lane files: %q", tip)
	}
	// Each lane file's fault bars link to their row of the fault list.
	if lane := read(t, files[0]); strings.Count(lane, `<a href="faults.html#f`) != len(r.Faults) {
		t.Errorf("lane file links %d faults, want %d", strings.Count(lane, `<a href="faults.html#f`), len(r.Faults))
	}
}

// The summary's fault rows count exactly the faults: per kind, the bars' proven and unproven
// counts add up to that kind's faults; the zombie and refused rows add up to the attempts.
func TestReportSummaryCounts(t *testing.T) {
	r, d := syntheticRun(300, 20, 45*time.Minute)
	var b strings.Builder
	s := summarize(r, d)
	if err := timeline.WriteSummary(&b, s); err != nil {
		t.Fatal(err)
	}
	if s.StepMS != (30*time.Second).Milliseconds() || s.Steps != 90 {
		t.Errorf("a 45-minute run in steps of %d ms, %d of them; want 30 s, 90", s.StepMS, s.Steps)
	}
	got := map[string]map[string]int{} // row label → part name → sum over the bars' tooltips
	tip := regexp.MustCompile(`<title>([^<,]+), \+[\d:.]+–\+[\d:.]+: ([^<]+)</title>`)
	for _, m := range tip.FindAllStringSubmatch(b.String(), -1) {
		if m[1] == lagRow { // a duration, not a count: TestReportSummaryApplyLag
			continue
		}
		if got[m[1]] == nil {
			got[m[1]] = map[string]int{}
		}
		for _, part := range strings.Split(m[2], ", ") {
			n, name, _ := strings.Cut(part, " ")
			c, err := strconv.Atoi(n)
			if err != nil {
				t.Fatalf("tooltip %q: %v", m[0], err)
			}
			got[m[1]][name] += c
		}
	}
	want := map[string]map[string]int{}
	for _, f := range r.Faults {
		if want[string(f.Kind)] == nil {
			want[string(f.Kind)] = map[string]int{}
		}
		want[string(f.Kind)][map[bool]string{true: "proven", false: "not proven"}[f.Bit]]++
	}
	for _, a := range d.attempts {
		if a.zombie {
			want["zombie writes"] = addOne(want["zombie writes"], "refused by the fence")
		}
		want["writes refused as stale"] = addOne(want["writes refused as stale"], "refused as stale")
	}
	for label, parts := range want {
		for name, n := range parts {
			if got[label][name] != n {
				t.Errorf("%s: %s sums to %d in the drawing, want %d", label, name, got[label][name], n)
			}
		}
	}
	var recs int64
	for _, a := range d.applied {
		recs += a.records
	}
	if got["records applied"]["records applied"] != int(recs) {
		t.Errorf("records applied sum to %d, want %d", got["records applied"]["records applied"], recs)
	}
	// Workers committing: each worker once in each step it committed in.
	seen := map[string]bool{}
	for _, a := range d.applied {
		seen[fmt.Sprintf("%s@%d", a.who, (a.atMS-r.Started.UnixMilli())/s.StepMS)] = true
	}
	if n := got["workers committing"]["workers that committed in the step"]; n != len(seen) {
		t.Errorf("workers committing sum to %d over the steps, want %d", n, len(seen))
	}
}

// The summary's progress rows, by label.
const (
	lagRow     = "apply lag (largest)"
	backlogRow = "backlog (records)"
)

// stallRun is a ten-minute run (steps of 5 s) with known production and commit times: in step 2
// three batches whose lags are 0.3, 2 and 0.5 s (the largest neither the first nor the last),
// in step 3 one whose production is unknown, in step 12 a partition's backlog produced in
// step 4 committing after a stall (41 s) with another batch of 0.3 s, and in step 20 one of
// 0.8 s. A batch of another topic (commands, say), whose lag is 1 s, commits in step 5. The
// producer's acknowledgements cover every batch of topic t, and 9 records more that are never
// applied.
func stallRun() (*Result, runData) {
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ms := func(s float64) int64 { return start.Add(time.Duration(s * float64(time.Second))).UnixMilli() }
	r := &Result{Config: Config{Mode: Fenced, Workers: 3}, Started: start, Finished: start.Add(10 * time.Minute), Settled: true}
	batch := func(topic string, part int32, produced, committed float64, records int64) committedBatch {
		b := committedBatch{lane: lane{topic, part}, atMS: ms(committed), epoch: 1, who: "w1", records: records}
		if produced > 0 {
			b.producedMS = ms(produced)
		}
		return b
	}
	d := runData{applied: []committedBatch{
		batch("t", 0, 10.0, 10.3, 10),
		batch("t", 1, 9.0, 11.0, 5),
		batch("t", 2, 11.5, 12.0, 4),
		batch("t", 0, 0, 16.0, 6),
		batch("cmd", 0, 25.0, 26.0, 50),
		batch("t", 3, 20.0, 61.0, 7),
		batch("t", 0, 60.9, 61.2, 3),
		batch("t", 1, 100.0, 100.8, 2),
	}}
	acked := make([]int64, 111)
	for sec, n := range map[int]int64{9: 5, 10: 10, 11: 4, 15: 6, 20: 7, 60: 3, 100: 2, 110: 9} {
		acked[sec] = n
	}
	r.acked = map[string][]int64{"t": acked}
	return r, d
}

// summaryRow returns the summary's row labelled label, failing the test without one.
func summaryRow(t *testing.T, s timeline.Summary, label string) timeline.Row {
	t.Helper()
	for _, row := range s.Rows {
		if row.Label == label {
			return row
		}
	}
	t.Fatalf("the summary has no row %q", label)
	return timeline.Row{}
}

// The apply lag of a step is the largest of its batches' commit time minus their oldest
// record's production, drawn in the step the batch committed (a stall's lag where its backlog
// commits); a batch whose production is unknown adds none. The note gives the worst and the
// median of the steps that have one, and the tooltips say the lag in seconds.
func TestReportSummaryApplyLag(t *testing.T) {
	r, d := stallRun()
	s := summarize(r, d)
	if s.StepMS != 5000 || s.Steps != 120 {
		t.Fatalf("steps of %d ms, %d of them; want 5 s, 120", s.StepMS, s.Steps)
	}
	row := summaryRow(t, s, lagRow)
	want := make([]int64, 120)
	want[2], want[5], want[12], want[20] = 2000, 1000, 41000, 800
	if got := row.Parts[0].Counts; !slices.Equal(got, want) {
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("step %d: lag %d ms, want %d", i, got[i], want[i])
			}
		}
	}
	// The median of 0.8, 1, 2 and 41 s: the mean of the middle two.
	if row.Note != "worst 41.0 s; median of steps 1.50 s" {
		t.Errorf("note %q, want the worst 41.0 s and the median 1.50 s", row.Note)
	}
	var b strings.Builder
	if err := timeline.WriteSummary(&b, s); err != nil {
		t.Fatal(err)
	}
	if tip := lagRow + ", +1:00–+1:05: largest apply lag 41.0 s"; !strings.Contains(b.String(), tip) {
		t.Errorf("summary lacks the tooltip %q", tip)
	}

	// Without any batch's production known, the row says so and draws nothing.
	for i := range d.applied {
		d.applied[i].producedMS = 0
	}
	row = summaryRow(t, summarize(r, d), lagRow)
	if row.Note != "not recorded" || slices.Max(row.Parts[0].Counts) != 0 {
		t.Errorf("without production times: note %q, lags %v; want not recorded, none", row.Note, row.Parts[0].Counts)
	}
}

// The backlog at a step's end is what the producer had acknowledged by then minus what was
// applied of its topics by then: a stalled partition's records wait in it until they commit,
// records never applied stay to the end, and another topic's batches do not count. A run
// that did not count its acknowledgements has no backlog row.
func TestReportSummaryBacklog(t *testing.T) {
	r, d := stallRun()
	row := summaryRow(t, summarize(r, d), backlogRow)
	want := make([]int64, 120)
	want[1] = 5
	for i := 4; i < 12; i++ {
		want[i] = 7
	}
	for i := 22; i < 120; i++ {
		want[i] = 9
	}
	if got := row.Parts[0].Counts; !slices.Equal(got, want) {
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("step %d: backlog %d, want %d", i, got[i], want[i])
			}
		}
	}
	if row.Note != "at most 9; 9 at the end" {
		t.Errorf("note %q, want at most 9; 9 at the end", row.Note)
	}
	r.acked = nil
	for _, row := range summarize(r, d).Rows {
		if row.Label == backlogRow {
			t.Error("a run without acknowledgements counted has a backlog row")
		}
	}
}

func addOne(m map[string]int, k string) map[string]int {
	if m == nil {
		m = map[string]int{}
	}
	m[k]++
	return m
}

// Faults in flight are the most at any one instant of a step, from the intervals: overlaps
// count, a fault ending as another starts does not, an instant's fault counts once.
func TestInFlight(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	faults := []Fault{
		{Start: at(0.5), End: at(3.5)},  // steps 0-3
		{Start: at(1.2), End: at(1.8)},  // overlaps it in step 1
		{Start: at(1.8), End: at(2.2)},  // starts as the second ends: still 2 at once
		{Start: at(5.5), End: at(5.5)},  // an instant
		{Start: at(7), End: at(9)},      // steps 7-8
		{Start: at(7.5), End: at(8.5)},  // with it
		{Start: at(8.2), End: at(20.0)}, // three at once in step 8, past the end in the last step
	}
	got := inFlight(faults, t0, time.Second, 10)
	want := []int64{1, 2, 2, 1, 0, 1, 0, 2, 3, 1}
	if !slices.Equal(got, want) {
		t.Errorf("in flight %v, want %v", got, want)
	}
}

// WriteReport and WriteTimeline draw from the run's database, SQLite's or PostgreSQL's: its
// batches and the writes that did not commit, lane by lane.
func TestReportFromDatabase(t *testing.T) {
	for _, c := range []struct {
		name string
		db   func(*testing.T) DB
	}{{"SQLite", topicCheckDB}, {"PostgreSQL", func(t *testing.T) DB {
		pool, _ := testenv.Postgres(t)
		db := PgDB(pool)
		if err := Migrate(context.Background(), db); err != nil {
			t.Fatal(err)
		}
		return db
	}}} {
		t.Run(c.name, func(t *testing.T) { reportFromDatabase(t, c.db(t)) })
	}
}

func reportFromDatabase(t *testing.T, db DB) {
	ctx := context.Background()
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ms := func(s int) int64 { return start.Add(time.Duration(s) * time.Second).UnixMilli() }
	applied(t, db, 0, 0, 9, 0, 1, "w1", ms(10))
	applied(t, db, 0, 10, 19, 0, 2, "w2", ms(40))
	applied(t, db, 17, 0, 4, 0, 1, "w3", ms(50))
	if err := db.Exec(ctx, `UPDATE chaos_applied SET produced_ms = $1 WHERE part = 17`, ms(50)-2500); err != nil {
		t.Fatal(err)
	}
	for _, a := range []struct {
		outcome string
		zombie  bool
	}{{OutcomeStale, true}, {OutcomeError, false}, {OutcomeCommitted, false}} {
		if err := db.Exec(ctx, `INSERT INTO chaos_attempts (worker, topic, part, era, epoch, first_off, last_off, outcome, zombie, detail, at_ms) VALUES ('w1', 't', 0, 0, 1, 10, 19, $1, $2, '', $3)`,
			a.outcome, a.zombie, ms(45)); err != nil {
			t.Fatal(err)
		}
	}
	r := &Result{Config: Config{Mode: Fenced}, Started: start, Finished: start.Add(time.Minute), Settled: true,
		Faults: []Fault{{Kind: "freeze", Target: "w1", Detail: "held", Start: start.Add(20 * time.Second), End: start.Add(44 * time.Second), Bit: true}}}
	dir := t.TempDir()
	if err := WriteReport(ctx, dir, db, r); err != nil {
		t.Fatal(err)
	}
	if index := read(t, filepath.Join(dir, ReportIndex)); strings.Count(index, "<svg") != 2 || !strings.Contains(index, "last by w2, token 0.2") {
		t.Error("index of a run of one lane file does not draw it under the summary")
	}
	lanes := read(t, filepath.Join(dir, "lanes-01.svg"))
	for _, want := range []string{"partition 0", "partition 17", "last by w2, token 0.2", "w1 stale with token 0.1", "w1 error with token 0.1", "1: freeze w1 — held"} {
		if !strings.Contains(lanes, want) {
			t.Errorf("lane file lacks %q", want)
		}
	}
	if strings.Contains(lanes, "w1 committed") {
		t.Error("a committed write is drawn as refused")
	}
	sum := read(t, filepath.Join(dir, ReportSummary))
	for _, want := range []string{"1 refused, 0 aborted, 0 committed", ">25<" /* records applied */, "1 (1 proven)", "worst 2.50 s; median of steps 2.50 s"} {
		if !strings.Contains(sum, want) {
			t.Errorf("summary lacks %q", want)
		}
	}
	var b strings.Builder
	if err := WriteTimeline(ctx, &b, db, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"verdict PASS", "partition 17", "last by w2, token 0.2", "w1 stale with token 0.1", "1: freeze w1 — held"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("timeline lacks %q", want)
		}
	}
}

func read(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func wellFormed(t *testing.T, name string) {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := xml.NewDecoder(f)
	for {
		if _, err := dec.Token(); err == io.EOF {
			return
		} else if err != nil {
			t.Fatalf("%s is not well-formed: %v", filepath.Base(name), err)
		}
	}
}

func svgSize(t *testing.T, name string) (int, int) {
	t.Helper()
	m := regexp.MustCompile(`<svg [^>]*width="(\d+)" height="(\d+)"`).FindStringSubmatch(read(t, name))
	if m == nil {
		t.Fatalf("%s has no size", name)
	}
	w, _ := strconv.Atoi(m[1])
	h, _ := strconv.Atoi(m[2])
	return w, h
}
