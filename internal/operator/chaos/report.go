package chaos

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/batonhq/baton/internal/operator/timeline"
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
	if r.Schedule != nil {
		fmt.Fprintf(tw, "faults overlapping another / most in flight at once\t%d of %d / %d (overlap %d, %d scheduled)\n",
			r.Concurrent, len(r.Faults), r.MaxInFlight, r.Config.Overlap, len(r.Schedule))
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
	if v.CommandsInverted > 0 {
		fmt.Fprintf(tw, "commands read out of order across two destination topics\t%d\n", v.CommandsInverted)
	}
	fmt.Fprintf(tw, "stale commits\t%d\n", v.StaleCommits)
	fmt.Fprintf(tw, "tokens with two committing workers\t%d\n", v.SameTokenWriters)
	fmt.Fprintf(tw, "zombie writes committed after their takeover\t%d\n", v.ZombieOverTaken)
	fmt.Fprintf(tw, "re-applied batches\t%d\n", v.OverlapBatches)
	if v.HeldApplied > 0 || r.hasTopicFaults() {
		fmt.Fprintf(tw, "batches applied from a recreated or grown topic before its release\t%d\n", v.HeldApplied)
	}
	writeAudit(tw, r.Audit)
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
	if r.Audit != nil && len(r.Audit.Violations) > 0 {
		out = append(out, fmt.Sprintf("%d violations found by baton audit", len(r.Audit.Violations)))
	}
	return out
}

// WriteTimeline writes an SVG timeline of the run from what the database holds: per
// partition, a lane of committed batches coloured by owner token, refused writes as red
// crosses (zombies' ringed), and the faults as labelled bands, from real data.
// internal/operator/timeline draws it (the live status page draws with it too).
func WriteTimeline(ctx context.Context, w io.Writer, db DB, r *Result) error {
	type lane struct {
		topic string
		part  int32
	}
	type batch struct {
		lane
		b timeline.Batch
	}
	type mark struct {
		lane
		m timeline.Mark
	}
	var batches []batch
	rows, err := db.Query(ctx, `SELECT topic, part, at_ms, era, epoch, worker FROM chaos_applied ORDER BY id`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var b batch
		if err := rows.Scan(&b.topic, &b.part, &b.b.AtMS, &b.b.Era, &b.b.Epoch, &b.b.Who); err != nil {
			rows.Close()
			return err
		}
		batches = append(batches, b)
	}
	rows.Close()
	var marks []mark
	rows, err = db.Query(ctx, `SELECT topic, part, at_ms, worker, outcome, zombie, era, epoch FROM chaos_attempts WHERE outcome <> 'committed' ORDER BY id`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var a mark
		var era, epoch int64
		if err := rows.Scan(&a.topic, &a.part, &a.m.AtMS, &a.m.Who, &a.m.Outcome, &a.m.Zombie, &era, &epoch); err != nil {
			rows.Close()
			return err
		}
		a.m.Token = fmt.Sprintf("%d.%d", era, epoch)
		a.m.Frozen = a.m.Outcome == OutcomeFrozen || a.m.Outcome == OutcomeDelayed
		marks = append(marks, a)
	}
	rows.Close()
	// One lane per topic partition that has a committed batch or a refused write, in order.
	index := map[lane]int32{}
	var lanes []lane
	for _, b := range batches {
		if _, ok := index[b.lane]; !ok {
			index[b.lane] = 0
			lanes = append(lanes, b.lane)
		}
	}
	for _, m := range marks {
		if _, ok := index[m.lane]; !ok {
			index[m.lane] = 0
			lanes = append(lanes, m.lane)
		}
	}
	sort.Slice(lanes, func(i, j int) bool {
		return lanes[i].topic < lanes[j].topic || lanes[i].topic == lanes[j].topic && lanes[i].part < lanes[j].part
	})
	multi := len(lanes) > 0 && lanes[0].topic != lanes[len(lanes)-1].topic
	t := timeline.Timeline{
		Title: fmt.Sprintf("Baton chaos run: mode %s, %d faults, verdict %s",
			r.Config.Mode, len(r.Faults), map[bool]string{true: "PASS", false: "FAIL"}[r.OK()]),
		Lanes:  len(lanes),
		FromMS: r.Started.UnixMilli(),
		ToMS:   r.Finished.UnixMilli(),
	}
	for i, l := range lanes {
		index[l] = int32(i)
		label := fmt.Sprintf("partition %d", l.part)
		if multi {
			label = fmt.Sprintf("%s/%d", l.topic, l.part)
		}
		t.LaneLabels = append(t.LaneLabels, label)
	}
	for _, b := range batches {
		b.b.Lane = index[b.lane]
		t.Batches = append(t.Batches, b.b)
	}
	for _, m := range marks {
		m.m.Lane = index[m.lane]
		t.Marks = append(t.Marks, m.m)
	}
	for _, f := range r.Faults {
		t.Bands = append(t.Bands, timeline.Band{StartMS: f.Start.UnixMilli(), EndMS: f.End.UnixMilli(),
			Label: string(f.Kind) + " " + f.Target + " — " + f.Detail})
	}
	return timeline.Write(w, t)
}
