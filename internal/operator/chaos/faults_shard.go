package chaos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// shardOutage is FaultShardOutage: it stops a shard other than the home (the next in turn),
// holds it down, restarts it, and proves and measures the outage (ShardOutage). Every second
// outage of a run also stops a worker gracefully (SIGTERM) and starts a replacement while the
// shard is down, so the group rebalances during it, and is held down ten seconds longer: the
// consumer's assignment callback waits up to ten seconds for the new partitions' claims, and a
// claim on the stopped shard fails only when that wait ends, which the longest pause of the
// other shards' partitions (OthersGap) measures.
//
// The outage starts once every partition is applying (a batch of each in the last two seconds,
// waited for at most thirty), so that it does not fall into the group's forming rebalances.
func (h *harness) shardOutage(ctx context.Context, f *Fault) {
	s := h.shards
	if s == nil || len(s.pools) < 2 {
		f.Detail = "no sharded sink of two shards or more"
		return
	}
	st := h.cfg.SessionTimeout
	i := 1 + s.outageOf%(len(s.pools)-1)
	rebalance := s.outageOf%2 == 1
	s.outageOf++
	o := ShardOutage{Shard: shardName(i)}
	for p := int32(0); p < h.cfg.Partitions; p++ {
		if s.shardOf(h.cfg.Group, h.cfg.Topic, p) == i {
			o.Partitions = append(o.Partitions, p)
		}
	}
	f.Target = o.Shard
	waited := time.Now()
	if n := h.waitApplying(ctx, 30*time.Second); n < h.cfg.Partitions {
		h.progress("shard-outage: %d of %d partitions applying after %.1fs; stopping %s anyway", n, h.cfg.Partitions, time.Since(waited).Seconds(), o.Shard)
	} else {
		h.progress("shard-outage: every partition applying after %.1fs; stopping %s", time.Since(waited).Seconds(), o.Shard)
	}
	n := strconv.Itoa(i + 1)
	if err := h.sameCluster(ctx, i); err != nil {
		f.Detail = err.Error() + ": not stopped"
		return
	}
	if ok, msg := h.script(ctx, "postgres-shards.sh", "stop", n); !ok {
		f.Detail = msg
		return
	}
	down := time.Now()
	sleep(ctx, 500*time.Millisecond)
	o.Refused = !h.shardUp(ctx, i)
	hold := max(2*st, 5*time.Second)
	if rebalance {
		hold += 10 * time.Second
		if p := h.pick(ctx); p != nil {
			h.stop(p, syscall.SIGTERM, 30*time.Second)
			o.Rebalance = p.id
			if err := h.start(ctx); err != nil {
				o.Rebalance += " (no replacement: " + err.Error() + ")"
			}
		}
	}
	sleep(ctx, hold-time.Since(down))
	ends, endsErr := h.adm.ListEndOffsets(ctx, h.cfg.Topic) // what was produced before the restart
	up := time.Now()
	o.Down = up.Sub(down)
	ok, msg := h.script(ctx, "postgres-shards.sh", "start", n)
	defer func() {
		s.outages = append(s.outages, o)
		f.Bit = o.Isolated()
		f.Detail = o.String()
		if !ok {
			f.Detail += "; restart failed: " + msg
		}
		if endsErr != nil {
			f.Detail += "; end offsets: " + endsErr.Error()
		}
		f.End = time.Now()
		sleep(ctx, st)
	}()
	if !ok || endsErr != nil {
		return
	}
	for deadline := time.Now().Add(30 * time.Second); !o.Back && time.Now().Before(deadline) && ctx.Err() == nil; {
		if o.Back = h.shardUp(ctx, i); !o.Back {
			sleep(ctx, 200*time.Millisecond)
		}
	}
	if !o.Back {
		return
	}
	want := map[int32]int64{} // the last offset produced before the restart, by partition
	for _, p := range o.Partitions {
		if e, ok := ends.Lookup(h.cfg.Topic, p); ok && e.Err == nil && e.Offset > 0 {
			want[p] = e.Offset - 1
		}
	}
	// Nothing of the stopped shard commits while it is down: what it applied before the stop
	// is what it held at the restart.
	before, err := h.shardApplied(ctx, i, down)
	if err != nil {
		f.Detail = err.Error()
		return
	}
	for p, last := range want {
		a := int64(-1) // nothing applied yet
		if v, ok := before[p]; ok {
			a = v
		}
		o.Pending += max(last-a, 0)
	}
	for deadline := up.Add(h.cfg.Settle); time.Now().Before(deadline) && ctx.Err() == nil; sleep(ctx, 100*time.Millisecond) {
		now, err := h.shardApplied(ctx, i, time.Now().Add(time.Hour))
		if err != nil {
			continue
		}
		done := true
		for p, last := range want {
			if a, ok := now[p]; !ok || a < last {
				done = false
			}
		}
		if done {
			o.CaughtUp = time.Since(up)
			break
		}
	}
	o.Others, o.OthersGap, o.OthersGapPart = h.othersDuring(ctx, i, down, up)
}

// sameCluster checks that shard i's URL names the server of postgres-shards.sh's cluster i+1
// (as the script's environment places it), so the fault never stops another database.
func (h *harness) sameCluster(ctx context.Context, i int) error {
	ok, line := h.script(ctx, "postgres-shards.sh", "env")
	if !ok {
		return fmt.Errorf("postgres-shards.sh env: %s", line)
	}
	_, list, _ := strings.Cut(line, "=")
	urls := strings.Split(strings.Trim(list, "'"), ",")
	if i >= len(urls) {
		return fmt.Errorf("postgres-shards.sh has %d clusters, %s is the %dth shard", len(urls), shardName(i), i+1)
	}
	script, err1 := pgx.ParseConfig(urls[i])
	ours, err2 := pgx.ParseConfig(h.shards.urls[i])
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	if script.Host != ours.Host || script.Port != ours.Port {
		return fmt.Errorf("%s is at %s:%d, postgres-shards.sh's cluster %d at %s:%d", shardName(i), ours.Host, ours.Port, i+1, script.Host, script.Port)
	}
	return nil
}

// shardUp reports whether shard i accepts a connection (a fresh one, not the pool's).
func (h *harness) shardUp(ctx context.Context, i int) bool {
	cfg, err := pgx.ParseConfig(h.shards.urls[i])
	if err != nil {
		return false
	}
	cfg.ConnectTimeout = 2 * time.Second
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return false
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.Ping(cctx) == nil
}

// shardApplied returns the last offset of the run's topic shard i applied on each partition,
// among the batches logged before until.
func (h *harness) shardApplied(ctx context.Context, i int, until time.Time) (map[int32]int64, error) {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rows, err := h.shards.pools[i].Query(qctx, `SELECT part, max(last_off) FROM chaos_applied WHERE topic = $1 AND at_ms < $2 GROUP BY part`,
		h.cfg.Topic, until.UnixMilli())
	if err != nil {
		return nil, fmt.Errorf("chaos: read %s's applied log: %w", shardName(i), err)
	}
	defer rows.Close()
	out := map[int32]int64{}
	for rows.Next() {
		var p int32
		var last int64
		if err := rows.Scan(&p, &last); err != nil {
			return nil, err
		}
		out[p] = last
	}
	return out, rows.Err()
}

// othersDuring returns the records the shards other than i applied between from and to, and
// the longest time in it one of their partitions went without a batch, with that partition.
func (h *harness) othersDuring(ctx context.Context, i int, from, to time.Time) (int64, time.Duration, int32) {
	var n int64
	ats := map[int32][]int64{}
	for p := int32(0); p < h.cfg.Partitions; p++ {
		if h.shards.shardOf(h.cfg.Group, h.cfg.Topic, p) != i {
			ats[p] = []int64{from.UnixMilli(), to.UnixMilli()}
		}
	}
	for j, pool := range h.shards.pools {
		if j == i {
			continue
		}
		rows, err := pool.Query(ctx, `SELECT part, at_ms, last_off - first_off + 1 FROM chaos_applied WHERE topic = $1 AND at_ms >= $2 AND at_ms < $3`,
			h.cfg.Topic, from.UnixMilli(), to.UnixMilli())
		if err != nil {
			continue
		}
		for rows.Next() {
			var p int32
			var at, c int64
			if rows.Scan(&p, &at, &c) == nil {
				n += c
				ats[p] = append(ats[p], at)
			}
		}
		rows.Close()
	}
	var gap int64
	var part int32 = -1
	for p, a := range ats {
		slices.Sort(a)
		for k := 1; k < len(a); k++ {
			if d := a[k] - a[k-1]; d > gap || d == gap && p < part {
				gap, part = d, p
			}
		}
	}
	return n, time.Duration(gap) * time.Millisecond, part
}

// waitApplying waits until every partition of the run's topic had a batch applied in the last
// two seconds (in the live copy of the shards' logs), at most wait; it returns how many had.
func (h *harness) waitApplying(ctx context.Context, wait time.Duration) int32 {
	var n int32
	for deadline := time.Now().Add(wait); time.Now().Before(deadline) && ctx.Err() == nil; sleep(ctx, 250*time.Millisecond) {
		err := h.db.QueryRow(ctx, `SELECT count(DISTINCT part) FROM chaos_applied WHERE topic = $1 AND at_ms >= $2`,
			h.cfg.Topic, time.Now().Add(-2*time.Second).UnixMilli()).Scan(&n)
		if err == nil && n >= h.cfg.Partitions {
			break
		}
	}
	return n
}
