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
	for _, o := range r.ShardOutages {
		fmt.Fprintf(tw, "shard outage: %s\t%s\n", o.Shard, o.Verdict())
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
// internal/operator/timeline draws it (the live status page draws with it too). It draws every
// partition and lists every fault in one file, which suits a short run; [WriteReport] writes a
// report of any size.
func WriteTimeline(ctx context.Context, w io.Writer, db DB, r *Result) error {
	d, err := readRun(ctx, db)
	if err != nil {
		return err
	}
	lanes := d.lanes()
	t := d.timeline(r, lanes)
	t.Title = fmt.Sprintf("Baton chaos run: mode %s, %d faults, verdict %s",
		r.Config.Mode, len(r.Faults), map[bool]string{true: "PASS", false: "FAIL"}[r.OK()])
	for _, f := range r.Faults {
		t.Bands = append(t.Bands, timeline.Band{StartMS: f.Start.UnixMilli(), EndMS: f.End.UnixMilli(),
			Label: string(f.Kind) + " " + f.Target + " — " + f.Detail})
	}
	return timeline.Write(w, t)
}

// lane is a topic partition of the run.
type lane struct {
	topic string
	part  int32
}

// committedBatch is a committed batch, as chaos_applied holds it.
type committedBatch struct {
	lane
	atMS, era, epoch int64
	who              string
	records          int64
	producedMS       int64 // when its oldest record was produced; 0 if unknown
}

// writeAttempt is a write attempt that did not simply commit (or a zombie's that did), as
// chaos_attempts holds it.
type writeAttempt struct {
	lane
	atMS       int64
	who        string
	outcome    string
	zombie     bool
	era, epoch int64
}

// runData is what the reports draw from the database.
type runData struct {
	applied  []committedBatch
	attempts []writeAttempt
}

func readRun(ctx context.Context, db DB) (runData, error) {
	var d runData
	rows, err := db.Query(ctx, `SELECT topic, part, at_ms, era, epoch, worker, last_off - first_off + 1, produced_ms FROM chaos_applied ORDER BY id`)
	if err != nil {
		return d, err
	}
	for rows.Next() {
		var b committedBatch
		if err := rows.Scan(&b.topic, &b.part, &b.atMS, &b.era, &b.epoch, &b.who, &b.records, &b.producedMS); err != nil {
			rows.Close()
			return d, err
		}
		d.applied = append(d.applied, b)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return d, err
	}
	rows, err = db.Query(ctx, `SELECT topic, part, at_ms, worker, outcome, zombie, era, epoch FROM chaos_attempts WHERE outcome <> 'committed' OR zombie ORDER BY id`)
	if err != nil {
		return d, err
	}
	for rows.Next() {
		var a writeAttempt
		if err := rows.Scan(&a.topic, &a.part, &a.atMS, &a.who, &a.outcome, &a.zombie, &a.era, &a.epoch); err != nil {
			rows.Close()
			return d, err
		}
		d.attempts = append(d.attempts, a)
	}
	rows.Close()
	return d, rows.Err()
}

// lanes lists every topic partition that has a committed batch or a refused write, in order.
func (d runData) lanes() []lane {
	seen := map[lane]bool{}
	var lanes []lane
	for _, b := range d.applied {
		if !seen[b.lane] {
			seen[b.lane] = true
			lanes = append(lanes, b.lane)
		}
	}
	for _, a := range d.attempts {
		if !seen[a.lane] && a.outcome != OutcomeCommitted {
			seen[a.lane] = true
			lanes = append(lanes, a.lane)
		}
	}
	sort.Slice(lanes, func(i, j int) bool {
		return lanes[i].topic < lanes[j].topic || lanes[i].topic == lanes[j].topic && lanes[i].part < lanes[j].part
	})
	return lanes
}

// timeline draws lanes (of all the run's lanes, all) over the run's span: their batches and
// the writes that did not commit, without bands or a title.
func (d runData) timeline(r *Result, lanes []lane) timeline.Timeline {
	all := d.lanes()
	multi := len(all) > 0 && all[0].topic != all[len(all)-1].topic
	index := map[lane]int32{}
	t := timeline.Timeline{Lanes: len(lanes), FromMS: r.Started.UnixMilli(), ToMS: r.Finished.UnixMilli()}
	for i, l := range lanes {
		index[l] = int32(i)
		t.LaneLabels = append(t.LaneLabels, l.label(multi))
	}
	for _, b := range d.applied {
		if i, ok := index[b.lane]; ok {
			t.Batches = append(t.Batches, timeline.Batch{Lane: i, AtMS: b.atMS, Era: b.era, Epoch: b.epoch, Who: b.who})
		}
	}
	for _, a := range d.attempts {
		i, ok := index[a.lane]
		if !ok || a.outcome == OutcomeCommitted {
			continue
		}
		t.Marks = append(t.Marks, timeline.Mark{Lane: i, AtMS: a.atMS, Who: a.who, Outcome: a.outcome,
			Token: fmt.Sprintf("%d.%d", a.era, a.epoch), Zombie: a.zombie,
			Frozen: a.outcome == OutcomeFrozen || a.outcome == OutcomeDelayed})
	}
	return t
}

// label names a lane: its partition, with its topic when the run has several.
func (l lane) label(multi bool) string {
	if multi {
		return fmt.Sprintf("%s/%d", l.topic, l.part)
	}
	return fmt.Sprintf("partition %d", l.part)
}
