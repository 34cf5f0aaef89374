package main

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/batonhq/baton/consumer/chaos"
)

// The invariants' names, as the verdict table prints them.
const (
	invChargedTwice   = "saga: no order charged twice"
	invOrphanRefund   = "saga: no refund without a charge"
	invShippedRefund  = "saga: no order both shipped and refunded"
	invOneTerminal    = "saga: every order ends in exactly one terminal state"
	invCompensations  = "saga: every compensation matches a step that ran"
	invStepOrder      = "saga: per-order step order kept"
	invOutcomeEffects = "saga: every order's effects match its outcome"
)

// effects is what the services and the PSP did to one order, read from their databases.
type effects struct {
	reserves, releases, charges, refunds, shipments int64
}

// Check implements chaos.Workload: it reads the orchestrator's, the services' and the PSP's
// databases (nothing the workers said about themselves) and judges the saga's invariants.
func (s *Saga) Check(ctx context.Context, env chaos.Env) ([]chaos.Invariant, error) {
	p, closePSP, err := openPSP(ctx, env)
	if err != nil {
		return nil, err
	}
	defer closePSP()
	eff := map[string]*effects{}
	get := func(id string) *effects {
		e := eff[id]
		if e == nil {
			e = &effects{}
			eff[id] = e
		}
		return e
	}
	count := func(db chaos.DB, q string, add func(e *effects, kind string, n int64)) error {
		rows, err := db.Query(ctx, q)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id, kind string
			var n int64
			if err := rows.Scan(&id, &kind, &n); err != nil {
				return err
			}
			add(get(id), kind, n)
		}
		return rows.Err()
	}
	if err := count(env.DB, `SELECT order_id, kind, count(*) FROM stock_moves GROUP BY order_id, kind`, func(e *effects, kind string, n int64) {
		if kind == "reserve" {
			e.reserves = n
		} else {
			e.releases = n
		}
	}); err != nil {
		return nil, fmt.Errorf("stock moves: %w", err)
	}
	if err := count(env.DB, `SELECT order_id, 'ship', count(*) FROM shipments GROUP BY order_id`, func(e *effects, _ string, n int64) { e.shipments = n }); err != nil {
		return nil, fmt.Errorf("shipments: %w", err)
	}
	if err := count(p.db, `SELECT order_id, kind, count(*) FROM psp_ledger GROUP BY order_id, kind`, func(e *effects, kind string, n int64) {
		if kind == "charge" {
			e.charges = n
		} else {
			e.refunds = n
		}
	}); err != nil {
		return nil, fmt.Errorf("psp ledger: %w", err)
	}

	type logRow struct {
		n             int64
		from, to, ev  string
		worker, token string
		at            string // the partition the transition's record came from
	}
	logs := map[string][]logRow{}
	rows, err := env.DB.Query(ctx, `SELECT order_id, n, from_state, to_state, event, worker, era, epoch, topic, part FROM saga_log ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("saga log: %w", err)
	}
	for rows.Next() {
		var id string
		var l logRow
		var era, epoch int64
		var topic string
		var part int32
		if err := rows.Scan(&id, &l.n, &l.from, &l.to, &l.ev, &l.worker, &era, &epoch, &topic, &part); err != nil {
			rows.Close()
			return nil, err
		}
		l.token = fmt.Sprintf("%d.%d", era, epoch)
		l.at = fmt.Sprintf("%s/%d", topic, part)
		logs[id] = append(logs[id], l)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	states := map[string]string{}
	rows, err = env.DB.Query(ctx, `SELECT order_id, state FROM saga_orders`)
	if err != nil {
		return nil, fmt.Errorf("saga orders: %w", err)
	}
	for rows.Next() {
		var id, st string
		if err := rows.Scan(&id, &st); err != nil {
			rows.Close()
			return nil, err
		}
		states[id] = st
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}

	inv := map[string]*chaos.Invariant{}
	for _, n := range []string{invChargedTwice, invOrphanRefund, invShippedRefund, invOneTerminal, invCompensations, invStepOrder, invOutcomeEffects} {
		inv[n] = &chaos.Invariant{Name: n}
	}
	fail := func(name, format string, args ...any) {
		i := inv[name]
		i.Violations++
		if i.Example == "" {
			i.Example = fmt.Sprintf(format, args...)
		}
	}
	// Where the orders that did not end stopped: their state and the partition and worker of
	// their last transition (a stalled partition or relay shows as one place holding many).
	unended := map[string]int{}
	produced := s.produced.Load()
	ids := map[string]bool{}
	for i := int64(0); i < produced; i++ {
		ids[orderID(i)] = true
	}
	for id := range states {
		ids[id] = true
	}
	for id := range eff {
		ids[id] = true
	}
	for id := range ids {
		e := get(id)
		st := states[id]
		if e.charges > 0 {
			inv[invChargedTwice].Checked++
			if e.charges > 1 {
				fail(invChargedTwice, "%s charged %d times", id, e.charges)
			}
		}
		inv[invOrphanRefund].Checked += e.refunds
		if e.refunds > e.charges || e.refunds > 1 {
			fail(invOrphanRefund, "%s refunded %d times for %d charges", id, e.refunds, e.charges)
		}
		if e.shipments > 0 {
			inv[invShippedRefund].Checked++
			if e.refunds > 0 {
				fail(invShippedRefund, "%s shipped and refunded", id)
			}
		}
		inv[invOneTerminal].Checked++
		terminals := 0
		for _, l := range logs[id] {
			if l.to == stateCompleted || l.to == stateFailed {
				terminals++
			}
		}
		if (st != stateCompleted && st != stateFailed) || terminals != 1 {
			fail(invOneTerminal, "%s in state %q with %d terminal transitions", id, st, terminals)
			where := "no transition"
			if n := len(logs[id]); n > 0 {
				l := logs[id][n-1]
				where = fmt.Sprintf("last moved on %s by %s", l.at, l.worker)
			}
			unended[fmt.Sprintf("%q, %s", st, where)]++
		}
		inv[invCompensations].Checked += e.releases + e.refunds
		if e.releases > e.reserves || e.refunds > e.charges {
			fail(invCompensations, "%s: %d releases for %d reservations, %d refunds for %d charges", id, e.releases, e.reserves, e.refunds, e.charges)
		}
		if len(logs[id]) > 0 {
			inv[invStepOrder].Checked++
			prev := ""
			for i, l := range logs[id] {
				if l.n != int64(i+1) || l.from != prev || transitions[l.from][l.ev] != l.to {
					fail(invStepOrder, "%s step %d: %q -%s-> %q by %s (token %s) after %q", id, l.n, l.from, l.ev, l.to, l.worker, l.token, prev)
					break
				}
				prev = l.to
			}
		}
		if (e.charges > 0 && e.reserves == 0) || (e.shipments > 0 && e.charges == 0) {
			fail(invStepOrder, "%s: a step ran without the one before it (reserves %d, charges %d, shipments %d)", id, e.reserves, e.charges, e.shipments)
		}
		if st == stateCompleted || st == stateFailed {
			inv[invOutcomeEffects].Checked++
			want := int64(0)
			if st == stateCompleted {
				want = 1
			}
			if e.charges-e.refunds != want || e.shipments != want || e.reserves-e.releases != want || e.reserves > 1 {
				fail(invOutcomeEffects, "%s %s: reserved %d released %d, charged %d refunded %d, shipped %d", id, st, e.reserves, e.releases, e.charges, e.refunds, e.shipments)
			}
		}
	}
	if len(unended) > 0 {
		places := make([]string, 0, len(unended))
		for p := range unended {
			places = append(places, p)
		}
		sort.Slice(places, func(i, j int) bool {
			a, b := places[i], places[j]
			return unended[a] > unended[b] || unended[a] == unended[b] && a < b
		})
		var b strings.Builder
		for i, p := range places[:min(len(places), 6)] {
			if i > 0 {
				b.WriteString("; ")
			}
			fmt.Fprintf(&b, "%d in %s", unended[p], p)
		}
		inv[invOneTerminal].Example += " (not ended: " + b.String() + ")"
	}
	var out []chaos.Invariant
	for _, i := range inv {
		out = append(out, *i)
	}
	// The walk-through is told, not judged: a database it cannot read leaves the verdict alone.
	if s.story, err = walkThrough(ctx, env, p.db, s.started); err != nil {
		s.story = fmt.Sprintf("Walk-through: not told (%v).\n", err)
	}
	return out, nil
}

// Story is the walk-through of one order the last Check told: across a takeover in a fenced
// run, charged twice in an unfenced one.
func (s *Saga) Story() string { return s.story }
