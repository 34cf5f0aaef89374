package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/batonhq/baton/consumer/chaos"
)

// walkThrough tells, from the run's databases alone, the story of one order across a
// takeover: which worker moved its saga at each step under which token, when the worker that
// held one of its events froze, and how its write was refused when it woke. It picks the
// first zombie write the fence refused on an orchestrator topic. An unfenced run tells the
// story of an order charged twice instead.
func walkThrough(ctx context.Context, env chaos.Env, psp chaos.DB, started time.Time) (string, error) {
	db := env.DB
	type attempt struct {
		worker, topic string
		part          int32
		era, epoch    int64
		last, at      int64
	}
	var zs []attempt
	rows, err := db.Query(ctx, `SELECT worker, topic, part, era, epoch, last_off, at_ms FROM chaos_attempts
WHERE zombie = true AND outcome = 'stale' ORDER BY id`)
	if err != nil {
		return "", err
	}
	for rows.Next() {
		var a attempt
		if err := rows.Scan(&a.worker, &a.topic, &a.part, &a.era, &a.epoch, &a.last, &a.at); err != nil {
			rows.Close()
			return "", err
		}
		zs = append(zs, a)
	}
	rows.Close()
	base := env.Topic("")
	short := func(t string) string { return strings.TrimPrefix(t, base+"-") }
	t0 := started.UnixMilli()
	at := func(ms int64) string { return fmt.Sprintf("%+7.1fs", float64(ms-t0)/1000) }
	if !env.Fenced {
		return doubleCharge(ctx, db, psp, at)
	}
	if len(zs) == 0 {
		return "Walk-through: no zombie write was refused in this run (no frozen worker was taken over).\n", nil
	}
	for _, z := range zs {
		var id string
		err := db.QueryRow(ctx, `SELECT order_id FROM saga_log WHERE topic = $1 AND part = $2 AND off <= $3
AND (era > $4 OR (era = $4 AND epoch > $5)) ORDER BY off DESC LIMIT 1`, z.topic, z.part, z.last, z.era, z.epoch).Scan(&id)
		if err != nil {
			continue // a service's batch, or no saga step in it: try the next refusal
		}
		type line struct {
			at   int64
			text string
		}
		var lines []line
		rows, err := db.Query(ctx, `SELECT n, from_state, to_state, event, worker, era, epoch, topic, part, off, at_ms FROM saga_log WHERE order_id = $1 ORDER BY n`, id)
		if err != nil {
			return "", err
		}
		for rows.Next() {
			var n, era, epoch, off, ms int64
			var from, to, ev, worker, topic string
			var part int32
			if err := rows.Scan(&n, &from, &to, &ev, &worker, &era, &epoch, &topic, &part, &off, &ms); err != nil {
				rows.Close()
				return "", err
			}
			if from == "" {
				from = "(new)"
			}
			lines = append(lines, line{ms, fmt.Sprintf("%s  %-4s token %d.%-3d %-24s step %d: %-11s %s -> %s",
				at(ms), worker, era, epoch, fmt.Sprintf("%s/%d@%d", short(topic), part, off), n, ev, from, to)})
		}
		rows.Close()
		var frozeAt int64
		if db.QueryRow(ctx, `SELECT at_ms FROM chaos_attempts WHERE worker = $1 AND topic = $2 AND part = $3 AND outcome = 'frozen' AND at_ms <= $4 ORDER BY id DESC LIMIT 1`,
			z.worker, z.topic, z.part, z.at).Scan(&frozeAt) == nil {
			lines = append(lines, line{frozeAt, fmt.Sprintf("%s  %-4s token %d.%-3d froze (SIGSTOP) holding its batch of %s/%d up to @%d, this order's event among them",
				at(frozeAt), z.worker, z.era, z.epoch, short(z.topic), z.part, z.last)})
		}
		lines = append(lines, line{z.at, fmt.Sprintf("%s  %-4s token %d.%-3d woke (SIGCONT) and wrote that batch: REFUSED by the fence, stale token; nothing it would have sent left the outbox",
			at(z.at), z.worker, z.era, z.epoch)})
		sort.SliceStable(lines, func(i, j int) bool { return lines[i].at < lines[j].at })
		var b strings.Builder
		fmt.Fprintf(&b, "Walk-through: order %s across a takeover, from this run's databases (time since the run began):\n", id)
		for _, l := range lines {
			b.WriteString("  " + l.text + "\n")
		}
		return b.String(), nil
	}
	z := zs[0]
	return fmt.Sprintf("Walk-through: worker %s froze holding a batch of %s/%d (token %d.%d) and its write was REFUSED by the fence, stale token, %s after the run began; no saga step was in that batch (a service's batch, or events before any step).\n",
		z.worker, short(z.topic), z.part, z.era, z.epoch, time.Duration(z.at-t0)*time.Millisecond), nil
}

// doubleCharge tells the story of an order the PSP charged twice, from its ledger and the
// saga's log.
func doubleCharge(ctx context.Context, db, psp chaos.DB, at func(int64) string) (string, error) {
	var id string
	if err := psp.QueryRow(ctx, `SELECT order_id FROM psp_ledger WHERE kind = 'charge' GROUP BY order_id HAVING count(*) > 1 ORDER BY order_id LIMIT 1`).Scan(&id); err != nil {
		if isNoRows(err) {
			return "Walk-through: no order was charged twice in this run.\n", nil
		}
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Walk-through: order %s, charged twice without the fence (time since the run began):\n", id)
	rows, err := psp.Query(ctx, `SELECT kind, worker, at_ms FROM psp_ledger WHERE order_id = $1 ORDER BY id`, id)
	if err != nil {
		return "", err
	}
	for rows.Next() {
		var kind, worker string
		var ms int64
		if err := rows.Scan(&kind, &worker, &ms); err != nil {
			rows.Close()
			return "", err
		}
		fmt.Fprintf(&b, "  %s  %-4s PSP %s, no idempotency key (nothing like the outbox's exists without Baton)\n", at(ms), worker, kind)
	}
	rows.Close()
	fmt.Fprintf(&b, "  Both workers held the payment partition in turn and applied the same charge command: the\n")
	fmt.Fprintf(&b, "  one that lost the partition went on with the batch it had fetched, and nothing refused it.\n")
	return b.String(), rows.Err()
}
