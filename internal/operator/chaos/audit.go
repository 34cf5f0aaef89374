package chaos

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sort"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric/noop"

	"github.com/batonhq/baton/internal/operator/audit"
)

// AuditVerdict is what the online auditor (internal/operator/audit, 'baton audit') found,
// run beside the workers as an operator would: one auditor per group the workers join, a pass
// every Config.Audit from the workers' start until the backlog was applied, and a last pass
// then. It reads only what Baton records and what Kafka holds, read-only, never the chaos
// tables: an unfenced or locked run records no fences, so it can judge only what Kafka shows
// of it (see the Ownership check).
type AuditVerdict struct {
	Interval   time.Duration
	Passes     int                 // passes made, over every group
	Unread     int                 // of those, passes that could not read a source (a restart, a rebalance)
	Partitions int                 // fences judged in each group's last pass, summed
	Owned      int                 // of those, fences whose claimant was compared with the group's owner
	Violations []audit.Violation   // every violation, at its first sighting, oldest first
	ByCheck    map[audit.Check]int // the violations by check
}

// auditor runs the auditors of a run.
type auditor struct {
	v      AuditVerdict
	mu     sync.Mutex
	stop   context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
	last   map[string]*audit.Report // each group's last report
	closer []func()
}

// startAudit starts an auditor per group, each making a pass every interval; finish stops
// them after a last pass and returns what they found (nil without Config.Audit).
func (h *harness) startAudit(ctx context.Context) (finish func() *AuditVerdict, err error) {
	cfg := h.cfg
	if cfg.Audit <= 0 {
		return func() *AuditVerdict { return nil }, nil
	}
	store := cfg.PostgresURL
	if store == "" {
		store = cfg.SQLitePath
	}
	var logw io.Writer = io.Discard
	if f, err := os.CreateTemp(cfg.LogDir, "baton-chaos-audit-*.log"); err == nil {
		logw = f
		defer func() {
			if err != nil {
				_ = f.Close()
			}
		}()
	}
	a := &auditor{v: AuditVerdict{Interval: cfg.Audit, ByCheck: map[audit.Check]int{}}, last: map[string]*audit.Report{}}
	if c, ok := logw.(io.Closer); ok {
		a.closer = append(a.closer, func() { _ = c.Close() })
	}
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	a.stop = cancel
	var auditors []*audit.Auditor
	for _, g := range h.groups {
		acfg := audit.Config{Brokers: cfg.Brokers, Store: store, Group: g, KgoOpts: cfg.Kafka,
			OutputTopics: h.outputTopics(g), Timeout: 5 * time.Second,
			// The run's own bounds: a partition may wait for its backlog, and an outbox row
			// for its relay, as long as the checker lets the run settle; a new owner claims
			// at its assignment, a held transaction ends after twice the session timeout.
			Stall: cfg.Settle, OutboxAge: cfg.Settle, Handover: 10 * cfg.SessionTimeout,
			Logger: slog.New(slog.NewTextHandler(logw, nil)), Meter: noop.NewMeterProvider()}
		au, err := audit.New(acfg)
		if err != nil {
			cancel()
			for _, x := range auditors {
				x.Close()
			}
			return nil, fmt.Errorf("chaos: audit %s: %w", g, err)
		}
		auditors = append(auditors, au)
		a.closer = append(a.closer, au.Close)
	}
	for i, au := range auditors {
		g := h.groups[i]
		a.wg.Go(func() {
			t := time.NewTicker(cfg.Audit)
			defer t.Stop()
			for {
				a.pass(actx, g, au)
				select {
				case <-actx.Done():
					return
				case <-t.C:
				}
			}
		})
	}
	return func() *AuditVerdict {
		a.once.Do(func() {
			cancel()
			a.wg.Wait()
			// The last pass, after the backlog was applied: every judgement fed once more.
			for i, au := range auditors {
				a.pass(context.WithoutCancel(ctx), h.groups[i], au)
			}
			for _, c := range slices.Backward(a.closer) {
				c()
			}
			for _, r := range a.last {
				a.v.Partitions += r.Partitions
				a.v.Owned += r.Owned
			}
			sort.SliceStable(a.v.Violations, func(i, j int) bool { return a.v.Violations[i].At.Before(a.v.Violations[j].At) })
			h.progress("audit: %d passes (%d could not read a source), %d fences judged, %d violations", a.v.Passes, a.v.Unread, a.v.Partitions, len(a.v.Violations))
		})
		return &a.v
	}, nil
}

// pass makes one pass of au and records what it found.
func (a *auditor) pass(ctx context.Context, group string, au *audit.Auditor) {
	r, err := au.Pass(ctx)
	if ctx.Err() != nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.v.Passes++
	if err != nil {
		a.v.Unread++
	}
	if r == nil {
		return
	}
	a.last[group] = r
	// Report.Violations holds every violation the pass saw, the ones seen before too: a
	// violation is new when the auditor's own list of first sightings grew.
	_, recent := au.Last()
	for _, v := range recent[:min(r.New, len(recent))] {
		a.v.Violations = append(a.v.Violations, v)
		a.v.ByCheck[v.Check]++
	}
}

// outputTopics returns the outbox's destination topics of group: the built-in workload's
// command topics for the run's own group; none known for an application's (the delivery
// judgements are then skipped).
func (h *harness) outputTopics(group string) []string {
	if h.builtin == nil || h.builtin.w.CommandEvery <= 0 || group != h.cfg.Group {
		return nil
	}
	var out []string
	for _, s := range h.builtin.commandTopics() {
		out = append(out, h.env().Topic(s))
	}
	return out
}

// writeAudit adds the auditor's lines to the verdict table.
func writeAudit(w io.Writer, a *AuditVerdict) {
	if a == nil {
		return
	}
	fmt.Fprintf(w, "baton audit beside the run: passes (not read)\t%d (%d), every %s\n", a.Passes, a.Unread, a.Interval)
	fmt.Fprintf(w, "baton audit: fences judged / compared with their owner\t%d / %d\n", a.Partitions, a.Owned)
	for _, c := range audit.Checks {
		fmt.Fprintf(w, "baton audit: %s violations\t%d\n", c, a.ByCheck[c])
	}
	for i, v := range a.Violations {
		if i == 3 {
			fmt.Fprintf(w, "  ...\t%d more\n", len(a.Violations)-i)
			break
		}
		fmt.Fprintf(w, "  audit:\t%s\n", clip(v.String(), 200))
	}
}
