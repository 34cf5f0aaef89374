package chaos

import (
	"context"
	"fmt"
	"html"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"
)

// WriteVerdict writes the run's verdict table.
func WriteVerdict(w io.Writer, r *Result) {
	v := r.Verdict
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "mode\t%s\n", r.Config.Mode)
	if r.Config.App != nil {
		fmt.Fprintf(tw, "application\t%s\n", r.Config.App.Name())
	}
	counts := map[FaultKind]int{}
	bit := map[FaultKind]int{}
	for _, f := range r.Faults {
		counts[f.Kind]++
		if f.Bit {
			bit[f.Kind]++
		}
	}
	var kinds []string
	for k := range counts {
		kinds = append(kinds, string(k))
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		fmt.Fprintf(tw, "faults: %s\t%d injected, %d proven\n", k, counts[FaultKind(k)], bit[FaultKind(k)])
	}
	if r.Config.App == nil {
		fmt.Fprintf(tw, "records produced\t%d\n", v.Expected)
		fmt.Fprintf(tw, "records applied\t%d\n", v.Applied)
	}
	fmt.Fprintf(tw, "batches committed\t%d\n", v.Batches)
	for _, k := range v.AttemptKinds() {
		fmt.Fprintf(tw, "write attempts: %s\t%d\n", k, v.Attempts[k])
		if k != OutcomeError {
			continue
		}
		for _, g := range v.Errors {
			fmt.Fprintf(tw, "  error: %s\t%d  %s; e.g. %q\n", g.Cause, g.Count, causeNote(g.Cause), clip(g.Example, 160))
		}
	}
	fmt.Fprintf(tw, "zombie writes attempted\t%d\n", v.ZombieAttempts)
	fmt.Fprintf(tw, "zombie writes refused\t%d\n", v.ZombieRefused)
	fmt.Fprintf(tw, "zombie writes aborted by the database\t%d\n", v.ZombieAborted)
	fmt.Fprintf(tw, "zombie writes committed\t%d\n", v.ZombieCommitted)
	fmt.Fprintf(tw, "epoch regressions recovered\t%d\n", v.Recoveries)
	if v.CommandsExpected > 0 {
		fmt.Fprintf(tw, "commands via outbox: sent / applied via inbox\t%d / %d\n", v.CommandsExpected, v.CommandsApplied)
		fmt.Fprintf(tw, "commands missing / applied twice / out of order\t%d / %d / %d\n", v.CommandsMissing, v.CommandsDuplicated, v.CommandsDisorder)
	}
	for _, i := range v.Invariants {
		ex := ""
		if i.Example != "" {
			ex = "  e.g. " + clip(i.Example, 160)
		}
		fmt.Fprintf(tw, "%s\t%d violations in %d checked%s\n", i.Name, i.Violations, i.Checked, ex)
	}
	if r.Config.App == nil {
		fmt.Fprintf(tw, "lost\t%d\n", v.Lost)
		fmt.Fprintf(tw, "duplicated\t%d\n", v.Duplicated)
		fmt.Fprintf(tw, "out of order\t%d\n", v.Disorder)
	}
	fmt.Fprintf(tw, "stale commits\t%d\n", v.StaleCommits)
	fmt.Fprintf(tw, "re-applied batches\t%d\n", v.OverlapBatches)
	fmt.Fprintf(tw, "backlog applied after faults\t%v in %s (bound %s)\n", r.Settled, r.SettleIn.Round(100*time.Millisecond), r.Config.Settle)
	verdict := "PASS"
	if !r.OK() {
		verdict = "FAIL: " + strings.Join(append(v.Violations(), failReasons(r)...), "; ")
	}
	fmt.Fprintf(tw, "verdict\t%s\n", verdict)
	_ = tw.Flush()
}

// causeNote says in words what an error cause means in a chaos run.
func causeNote(cause string) string {
	switch {
	case cause == CauseCanceled:
		return "the write's context ended: its partition was revoked (a rebalance) or the worker was stopping"
	case cause == CauseDeadline:
		return "the write's deadline passed"
	case cause == CauseSQLiteBusy:
		return "SQLite's write lock stayed busy past the busy timeout"
	case cause == CausePostgres+" 25P03":
		return "PostgreSQL ended a transaction held open too long (idle_in_transaction_session_timeout)"
	case cause == CausePostgres+" 57P01", cause == CausePostgres+" 57P02", cause == CausePostgres+" 57P03":
		return "PostgreSQL was shutting down or restarting"
	case cause == CausePostgres+" 40001", cause == CausePostgres+" 40P01":
		return "PostgreSQL aborted the transaction (serialization failure or deadlock)"
	case strings.HasPrefix(cause, CausePostgres+" "):
		return "a PostgreSQL error (SQLSTATE " + strings.TrimPrefix(cause, CausePostgres+" ") + ")"
	case cause == CauseNetwork:
		return "the connection to the database failed"
	case cause == CauseRegression, cause == CauseConflict, cause == CauseInvalid:
		return "the fence refused the write"
	case cause == CauseBadRecord:
		return "a record that is not the workload's"
	}
	return "unclassified"
}

// clip shortens s to at most n bytes (cut at a character boundary), marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func failReasons(r *Result) []string {
	var out []string
	if !r.Settled {
		out = append(out, "backlog not applied within the bound")
	}
	return out
}

type tlBatch struct {
	topic  string
	part   int32
	at     int64
	era    int64
	epoch  int64
	worker string
}

type tlLane struct {
	topic string
	part  int32
}

type tlAttempt struct {
	topic   string
	part    int32
	at      int64
	worker  string
	outcome string
	zombie  bool
	token   string
}

// WriteTimeline writes an SVG timeline of the run from what the database holds: per
// partition, a lane of committed batches coloured by owner token, refused writes as red
// crosses (zombies' ringed), and the faults as labelled bands: the seeds' Figures 1 and 2,
// from real data.
func WriteTimeline(ctx context.Context, w io.Writer, db DB, r *Result) error {
	var batches []tlBatch
	rows, err := db.Query(ctx, `SELECT topic, part, at_ms, era, epoch, worker FROM chaos_applied ORDER BY id`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var b tlBatch
		if err := rows.Scan(&b.topic, &b.part, &b.at, &b.era, &b.epoch, &b.worker); err != nil {
			rows.Close()
			return err
		}
		batches = append(batches, b)
	}
	rows.Close()
	var attempts []tlAttempt
	rows, err = db.Query(ctx, `SELECT topic, part, at_ms, worker, outcome, zombie, era, epoch FROM chaos_attempts WHERE outcome <> 'committed' ORDER BY id`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var a tlAttempt
		var era, epoch int64
		if err := rows.Scan(&a.topic, &a.part, &a.at, &a.worker, &a.outcome, &a.zombie, &era, &epoch); err != nil {
			rows.Close()
			return err
		}
		a.token = fmt.Sprintf("%d.%d", era, epoch)
		attempts = append(attempts, a)
	}
	rows.Close()

	t0, t1 := r.Started.UnixMilli(), r.Finished.UnixMilli()
	if t1 <= t0 {
		t1 = t0 + 1
	}
	// One lane per topic partition that has a committed batch or a refused write, in order.
	laneOf := map[tlLane]int{}
	var lanes []tlLane
	for _, b := range batches {
		if _, ok := laneOf[tlLane{b.topic, b.part}]; !ok {
			laneOf[tlLane{b.topic, b.part}] = 0
			lanes = append(lanes, tlLane{b.topic, b.part})
		}
	}
	for _, a := range attempts {
		if _, ok := laneOf[tlLane{a.topic, a.part}]; !ok {
			laneOf[tlLane{a.topic, a.part}] = 0
			lanes = append(lanes, tlLane{a.topic, a.part})
		}
	}
	sort.Slice(lanes, func(i, j int) bool {
		return lanes[i].topic < lanes[j].topic || lanes[i].topic == lanes[j].topic && lanes[i].part < lanes[j].part
	})
	for i, l := range lanes {
		laneOf[l] = i
	}
	multi := len(lanes) > 0 && lanes[0].topic != lanes[len(lanes)-1].topic
	parts := len(lanes)
	left := 90
	if multi {
		left = 230
	}
	const top, laneH, width = 60, 22, 1100
	height := top + parts*laneH + 40 + 18*len(r.Faults)
	x := func(ms int64) float64 { return float64(left) + float64(ms-t0)/float64(t1-t0)*float64(width-left-20) }
	y := func(topic string, p int32) int { return top + laneOf[tlLane{topic, p}]*laneH }
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
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", width, height)
	fmt.Fprintf(w, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(w, `<text x="10" y="20" font-size="14" font-weight="bold">Baton chaos run: mode %s, %d faults, verdict %s</text>`+"\n",
		html.EscapeString(string(r.Config.Mode)), len(r.Faults), map[bool]string{true: "PASS", false: "FAIL"}[r.OK()])
	fmt.Fprintf(w, `<text x="10" y="38">Each lane is a partition; ticks are committed batches coloured by the writer's token (era.epoch); red crosses are refused writes, ringed when a frozen zombie made them.</text>`+"\n")
	for i, f := range r.Faults {
		fx0, fx1 := x(f.Start.UnixMilli()), x(f.End.UnixMilli())
		if fx1-fx0 < 2 {
			fx1 = fx0 + 2
		}
		fmt.Fprintf(w, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="#f2c14e" opacity="0.25"/>`+"\n", fx0, top-8, fx1-fx0, parts*laneH+8)
		fmt.Fprintf(w, `<text x="%.1f" y="%d">%d: %s %s — %s</text>`+"\n", fx0, top+parts*laneH+20+18*i, i+1,
			html.EscapeString(string(f.Kind)), html.EscapeString(f.Target), html.EscapeString(f.Detail))
	}
	for _, l := range lanes {
		name := fmt.Sprintf("partition %d", l.part)
		if multi {
			name = clip(l.topic, 28) + fmt.Sprintf("/%d", l.part)
		}
		fmt.Fprintf(w, `<text x="10" y="%d">%s</text>`+"\n", y(l.topic, l.part)+12, html.EscapeString(name))
		fmt.Fprintf(w, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#ddd"/>`+"\n", left, width-20, y(l.topic, l.part)+laneH/2, y(l.topic, l.part)+laneH/2)
	}
	// One tick per partition per pixel column, coloured by the last token committed in it, so a
	// soak of a million batches still draws a timeline of a few thousand ticks.
	type bucket struct {
		lane tlLane
		col  int
	}
	last := map[bucket]tlBatch{}
	count := map[bucket]int{}
	var order []bucket
	for _, b := range batches {
		k := bucket{tlLane{b.topic, b.part}, int(x(b.at))}
		if _, ok := last[k]; !ok {
			order = append(order, k)
		}
		last[k] = b
		count[k]++
	}
	for _, k := range order {
		b := last[k]
		fmt.Fprintf(w, `<rect x="%d" y="%d" width="2" height="%d" fill="%s"><title>%d batches; last by %s, token %d.%d</title></rect>`+"\n",
			k.col, y(b.topic, b.part)+3, laneH-6, tokColour(b.era, b.epoch), count[k], html.EscapeString(b.worker), b.era, b.epoch)
	}
	for _, a := range attempts {
		if a.outcome == OutcomeFrozen || a.outcome == OutcomeDelayed {
			fmt.Fprintf(w, `<text x="%.1f" y="%d" fill="#333"><title>%s froze holding token %s</title>❄</text>`+"\n", x(a.at)-4, y(a.topic, a.part)+15, html.EscapeString(a.worker), a.token)
			continue
		}
		cx, cy := x(a.at), float64(y(a.topic, a.part)+laneH/2)
		fmt.Fprintf(w, `<g stroke="#d62728" stroke-width="2"><title>%s %s with token %s</title><line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/><line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/></g>`+"\n",
			html.EscapeString(a.worker), html.EscapeString(a.outcome), a.token, cx-4, cy-4, cx+4, cy+4, cx-4, cy+4, cx+4, cy-4)
		if a.zombie {
			fmt.Fprintf(w, `<circle cx="%.1f" cy="%.1f" r="7" fill="none" stroke="#d62728"/>`+"\n", cx, cy)
		}
	}
	fmt.Fprintln(w, `</svg>`)
	return nil
}
