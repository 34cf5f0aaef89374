package chaos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/fence/shard"
)

// The built-in workload over a sharded sink (Config.ShardURLs): the fenced workers write
// through a shard.Router over several PostgreSQL databases, home first, so each partition's
// fence, its keys' state (chaos_state) and its applied log (chaos_applied) commit together in
// the database its placement names. The run's own logs (attempts, faults) stay in the run's
// database (Config.PostgresURL), written outside the batches' transactions as on one database.
//
// The run makes a schema of its own in every shard's database with the fence and workload
// tables, and publishes placement version 1 in the home shard: the default rule over the
// shards in order (shard-1, shard-2, ...), no entries.
//
// While the run goes on, the harness copies every shard's applied log into the run's
// chaos_applied, a few times a second, for its live views (a frozen worker's takeover, the
// backlog applied to its end); a shard that is down is copied once it is back. After the
// workers stopped, the copy is replaced by the shards' logs read whole, in each shard's commit
// order, and their states are copied into chaos_state (a key found in two shards fails the
// run), which the checker then judges as it judges a run on one database. A partition's batches
// all commit in one shard, so its order in the copy is its commit order.
//
// There is no outbox: the workload runs without commands.

// FaultShardOutage stops one shard's PostgreSQL (deploy/local/postgres-shards.sh, the cluster
// of Config.ShardURLs' position) for twice the session timeout (at least five seconds) and
// starts it again. It is proven when the stopped shard refused a connection during the outage,
// records of its partitions were produced and not applied when it came back, it accepted a
// connection again, and its partitions then applied everything produced before the restart.
// It is measured: the records the other shards' partitions applied during the outage, over
// what time, and their longest pause; the fault isolates only if they applied some
// ([ShardOutage]). The home shard is never stopped: it holds the placement and the topics'
// identities, which every claim reads (DESIGN.md, "Sharded sinks"). Nor is a cluster whose
// server is not the shard's URL's (as postgres-shards.sh env places it, with ScriptEnv): the
// fault is then not proven.
const FaultShardOutage FaultKind = "shard-outage"

// ShardFaults lists the kinds that need a sharded sink (Config.ShardURLs): they are in
// neither "all" nor "every".
var ShardFaults = []FaultKind{FaultShardOutage}

// ShardOutage is what one shard-outage fault proved and measured.
type ShardOutage struct {
	Shard      string        // the stopped shard's name (shard-N, its position in Config.ShardURLs)
	Partitions []int32       // the partitions placed on it
	Down       time.Duration // from the stop's return to the restart's beginning
	Refused    bool          // a connection to it failed during the outage
	Rebalance  string        // the worker stopped and replaced during the outage ("" for none)
	Pending    int64         // records of its partitions produced and not applied when it was restarted
	Back       bool          // it accepted a connection after the restart
	CaughtUp   time.Duration // from the restart until its partitions applied what was pending (0: not within the bound)
	// Others is what the other shards' partitions applied during the outage: records, and the
	// longest time in the outage one of them went without a batch committing, and which.
	Others        int64
	OthersGap     time.Duration
	OthersGapPart int32
}

// Isolated reports whether the outage was proven and the other shards kept applying.
func (o ShardOutage) Isolated() bool {
	return o.Refused && o.Pending > 0 && o.Back && o.CaughtUp > 0 && o.Others > 0
}

// String renders the outage as a verdict line.
func (o ShardOutage) String() string {
	s := fmt.Sprintf("%s down %.1fs (partitions %v, %d records pending, refused=%v, back=%v, caught up %.1fs after the restart began)",
		o.Shard, o.Down.Seconds(), o.Partitions, o.Pending, o.Refused, o.Back, o.CaughtUp.Seconds())
	if o.Rebalance != "" {
		s += "; " + o.Rebalance + " stopped (SIGTERM) and replaced meanwhile"
	}
	return s + fmt.Sprintf(": other shards applied %d records during %.1f s of outage (longest pause of one of their partitions %.1fs, partition %d)",
		o.Others, o.Down.Seconds(), o.OthersGap.Seconds(), o.OthersGapPart)
}

// Verdict is the outage's line in the verdict table.
func (o ShardOutage) Verdict() string {
	s := "isolated"
	if !o.Isolated() {
		s = "NOT isolated"
	}
	return fmt.Sprintf("%s: other shards applied %d records during %.1f s of outage (longest pause of one of their partitions %.1f s); %d records of its %d partitions pending, applied %.1f s after its restart began",
		s, o.Others, o.Down.Seconds(), o.OthersGap.Seconds(), o.Pending, len(o.Partitions), o.CaughtUp.Seconds())
}

// shardName names the shard at position i of Config.ShardURLs.
func shardName(i int) string { return "shard-" + strconv.Itoa(i+1) }

// shardDefaults checks a run's sharded-sink settings (Config.defaults calls it).
func (c *Config) shardDefaults() error {
	for _, f := range c.Faults {
		if f == FaultShardOutage && len(c.ShardURLs) < 2 {
			return fmt.Errorf("chaos: fault %s needs a sharded sink of two shards or more (ShardURLs)", f)
		}
		if f == FaultShardOutage && c.DeployDir == "" {
			return fmt.Errorf("chaos: fault %s needs DeployDir (deploy/local)", f)
		}
	}
	if len(c.ShardURLs) == 0 {
		return nil
	}
	if c.App != nil || c.Mode != Fenced || c.RedisSink != "" || c.PostgresURL == "" {
		return errors.New("chaos: a sharded sink runs the built-in workload, fenced, with the run's logs in PostgreSQL")
	}
	if c.Audit > 0 {
		return errors.New("chaos: the auditor reads one database; it does not run over a sharded sink")
	}
	c.Workload.CommandEvery = 0 // commands need an outbox per shard
	for _, f := range c.Faults {
		if isTopicFault(f) || f == FaultTwoTopicInbox || slices.Contains(NetFaults, f) {
			return fmt.Errorf("chaos: fault %s does not run over a sharded sink", f)
		}
	}
	return nil
}

// shardRun is the harness's side of a sharded sink: a pool per shard (on the run's schema in
// it) and the live copy of their applied logs.
type shardRun struct {
	urls     []string // the workers' URLs, with the run's schema
	pools    []*pgxpool.Pool
	place    shard.Placement
	outages  []ShardOutage
	outageOf int // the shard-outage faults injected, to pick the next target

	stopLive func()
	mu       sync.Mutex // serializes copies into chaos_applied
	seen     []map[int64]bool
	high     []int64
}

// openShards makes the run's schema in every shard's database, migrates the fence and workload
// tables there, publishes the placement in the home shard, and starts the live copy of the
// shards' applied logs. It does nothing without Config.ShardURLs.
func (h *harness) openShards(ctx context.Context) error {
	if len(h.cfg.ShardURLs) == 0 {
		return nil
	}
	s := &shardRun{}
	h.shards = s
	schema := "chaos_shard_" + strconv.FormatInt(h.t0.UnixNano(), 36)
	names := make([]string, len(h.cfg.ShardURLs))
	for i, u := range h.cfg.ShardURLs {
		names[i] = shardName(i)
		admin, err := pgx.Connect(ctx, u)
		if err != nil {
			return fmt.Errorf("chaos: %s: %w", names[i], err)
		}
		_, err = admin.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize())
		admin.Close(ctx)
		if err != nil {
			return fmt.Errorf("chaos: %s: create schema: %w", names[i], err)
		}
		sep := "?"
		if strings.Contains(u, "?") {
			sep = "&"
		}
		url := u + sep + "search_path=" + schema
		pcfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			return err
		}
		pcfg.ConnConfig.ConnectTimeout = 2 * time.Second
		pool, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			return err
		}
		s.urls, s.pools = append(s.urls, url), append(s.pools, pool)
		s.seen, s.high = append(s.seen, map[int64]bool{}), append(s.high, 0)
		store, err := pgfence.New(pool)
		if err == nil {
			err = store.Migrate(ctx)
		}
		if err == nil {
			err = Migrate(ctx, PgDB(pool))
		}
		if err != nil {
			return fmt.Errorf("chaos: %s: migrate: %w", names[i], err)
		}
	}
	pl := shard.Postgres(s.pools[0])
	if err := pl.Migrate(ctx); err != nil {
		return err
	}
	s.place = shard.Placement{Version: 1, Shards: names}
	if err := pl.Publish(ctx, s.place, "chaos run "+h.cfg.Group); err != nil {
		return fmt.Errorf("chaos: publish the placement: %w", err)
	}
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for lctx.Err() == nil {
			for i := range s.pools {
				_ = h.copyApplied(lctx, i)
			}
			sleep(lctx, 250*time.Millisecond)
		}
	}()
	s.stopLive = sync.OnceFunc(func() { cancel(); <-done })
	return nil
}

// closeShards stops the live copy and closes the pools.
func (h *harness) closeShards() {
	if h.shards == nil {
		return
	}
	if h.shards.stopLive != nil {
		h.shards.stopLive()
	}
	for _, p := range h.shards.pools {
		p.Close()
	}
}

// shardOf returns the position of the shard partition p of the run's topic is placed on.
func (s *shardRun) shardOf(group, topic string, p int32) int {
	name := s.place.Shard(fence.Key{Group: group, Topic: topic, Partition: p})
	n, _ := strconv.Atoi(strings.TrimPrefix(name, "shard-"))
	return n - 1
}

// appliedRow is one row of a shard's chaos_applied.
type appliedRow struct {
	id                          int64
	topic, worker               string
	part                        int32
	first, last, era, epoch, at int64
	produced                    int64 // produced_ms
}

const appliedCols = `id, topic, part, first_off, last_off, era, epoch, worker, at_ms, produced_ms`

func scanApplied(rows pgx.Rows) ([]appliedRow, error) {
	defer rows.Close()
	var out []appliedRow
	for rows.Next() {
		var r appliedRow
		if err := rows.Scan(&r.id, &r.topic, &r.part, &r.first, &r.last, &r.era, &r.epoch, &r.worker, &r.at, &r.produced); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// insertApplied appends rows to the run's chaos_applied, in their order, in one statement.
func (h *harness) insertApplied(ctx context.Context, rows []appliedRow) error {
	if len(rows) == 0 {
		return nil
	}
	var (
		topics, workers             []string
		parts                       []int32
		firsts, lasts, eras, epochs []int64
		ats, produced, ords         []int64
	)
	for i, r := range rows {
		topics, workers, parts = append(topics, r.topic), append(workers, r.worker), append(parts, r.part)
		firsts, lasts, eras, epochs = append(firsts, r.first), append(lasts, r.last), append(eras, r.era), append(epochs, r.epoch)
		ats, produced, ords = append(ats, r.at), append(produced, r.produced), append(ords, int64(i))
	}
	return h.db.Exec(ctx, `INSERT INTO chaos_applied (topic, part, first_off, last_off, era, epoch, worker, at_ms, produced_ms)
SELECT topic, part, first_off, last_off, era, epoch, worker, at_ms, produced_ms
FROM unnest($1::text[], $2::int[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::text[], $8::bigint[], $9::bigint[], $10::bigint[])
	AS r(topic, part, first_off, last_off, era, epoch, worker, at_ms, produced_ms, ord)
ORDER BY ord`, topics, parts, firsts, lasts, eras, epochs, workers, ats, produced, ords)
}

// copyApplied copies shard i's batches not copied yet into the run's chaos_applied. Ids are
// given at insert and a batch may commit after one with a higher id (of another partition),
// so it looks back a window below the highest id copied.
func (h *harness) copyApplied(ctx context.Context, i int) error {
	s := h.shards
	s.mu.Lock()
	defer s.mu.Unlock()
	qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	rows, err := s.pools[i].Query(qctx, `SELECT `+appliedCols+` FROM chaos_applied WHERE id > $1 ORDER BY id`, s.high[i]-1000)
	if err != nil {
		return err
	}
	got, err := scanApplied(rows)
	if err != nil {
		return err
	}
	var fresh []appliedRow
	for _, r := range got {
		if !s.seen[i][r.id] {
			fresh = append(fresh, r)
		}
	}
	if err := h.insertApplied(ctx, fresh); err != nil {
		return err
	}
	for _, r := range fresh {
		s.seen[i][r.id] = true
		s.high[i] = max(s.high[i], r.id)
	}
	return nil
}

// mirrorShards replaces the live copy of the applied log with every shard's log, read whole in
// each shard's commit order, and copies their states into chaos_state, for the checker. It
// does nothing without a sharded sink.
func (h *harness) mirrorShards(ctx context.Context) error {
	s := h.shards
	if s == nil {
		return nil
	}
	s.stopLive()
	if err := h.db.Exec(ctx, `DELETE FROM chaos_applied`); err != nil {
		return err
	}
	var batches, keys, recoveries int
	for i, p := range s.pools {
		rows, err := p.Query(ctx, `SELECT `+appliedCols+` FROM chaos_applied ORDER BY id`)
		if err != nil {
			return fmt.Errorf("chaos: read %s's applied log: %w", shardName(i), err)
		}
		got, err := scanApplied(rows)
		if err != nil {
			return fmt.Errorf("chaos: read %s's applied log: %w", shardName(i), err)
		}
		if err := h.insertApplied(ctx, got); err != nil {
			return err
		}
		batches += len(got)
		srows, err := p.Query(ctx, `SELECT k, n, last_seq, sum_seq, disorder FROM chaos_state`)
		if err != nil {
			return fmt.Errorf("chaos: read %s's state: %w", shardName(i), err)
		}
		var states []keyRow
		for srows.Next() {
			var e keyRow
			if err := srows.Scan(&e.k, &e.st.n, &e.st.last, &e.st.sum, &e.st.disorder); err != nil {
				srows.Close()
				return err
			}
			states = append(states, e)
		}
		srows.Close()
		if err := srows.Err(); err != nil {
			return err
		}
		for _, e := range states {
			if err := h.db.Exec(ctx, `INSERT INTO chaos_state (k, n, last_seq, sum_seq, disorder) VALUES ($1, $2, $3, $4, $5)`,
				e.k, e.st.n, e.st.last, e.st.sum, e.st.disorder); err != nil {
				return fmt.Errorf("chaos: the state of key %s from %s (is it in two shards?): %w", e.k, shardName(i), err)
			}
		}
		keys += len(states)
		n, err := h.copyRecoveries(ctx, p)
		if err != nil {
			h.progress("%s's recorded era advances not copied for the check: %v", shardName(i), err)
		}
		recoveries += n
	}
	h.progress("copied the %d shards' states (%d keys), applied logs (%d batches) and recorded era advances (%d) for the check", len(s.pools), keys, batches, recoveries)
	return nil
}

// copyRecoveries copies the era advances recorded in a shard's fence store (its default
// table) into the run's database's, which the checker counts.
func (h *harness) copyRecoveries(ctx context.Context, p *pgxpool.Pool) (int, error) {
	rows, err := p.Query(ctx, `SELECT group_id, topic, partition, from_era, from_epoch, to_era, to_epoch, reason FROM baton_fences_recoveries ORDER BY seq`)
	if err != nil {
		return 0, err
	}
	type rec struct {
		group, topic, reason            string
		part                            int32
		fromEra, fromEpoch, toEra, toEp int64
	}
	var recs []rec
	for rows.Next() {
		var r rec
		if err := rows.Scan(&r.group, &r.topic, &r.part, &r.fromEra, &r.fromEpoch, &r.toEra, &r.toEp, &r.reason); err != nil {
			rows.Close()
			return 0, err
		}
		recs = append(recs, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	for i, r := range recs {
		if err := h.db.Exec(ctx, `INSERT INTO baton_fences_recoveries (group_id, topic, partition, from_era, from_epoch, to_era, to_epoch, reason) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
			r.group, r.topic, r.part, r.fromEra, r.fromEpoch, r.toEra, r.toEp, r.reason); err != nil {
			return i, err
		}
	}
	return len(recs), nil
}

// keyRow is one row of a shard's chaos_state.
type keyRow struct {
	k  string
	st keyState
}

// runShardedWorker runs a fenced worker of the built-in workload over a shard.Router of the
// PostgreSQL databases at urls (home first), with the harness's fault points and attempt log
// around every write (attemptSink, logging to env.DB). The batch's state and applied-log rows
// are written in its shard's transaction.
func runShardedWorker(ctx context.Context, cfg WorkerConfig, env AppEnv, urls []string) error {
	if err := cfg.defaults(); err != nil {
		return err
	}
	if cfg.Mode != Fenced {
		return fmt.Errorf("%w: a sharded sink runs fenced", ErrUsage)
	}
	shards := map[string]shard.Shard[pgx.Tx]{}
	var home *pgxpool.Pool
	for i, u := range urls {
		pcfg, err := pgxpool.ParseConfig(u)
		if err != nil {
			return err
		}
		// As on one database: the database ends a transaction held open by a frozen worker.
		pcfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = strconv.FormatInt((2 * cfg.SessionTimeout).Milliseconds(), 10)
		pcfg.ConnConfig.ConnectTimeout = 2 * time.Second
		pool, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			return err
		}
		defer pool.Close()
		store, err := pgfence.New(pool)
		if err != nil {
			return err
		}
		shards[shardName(i)] = store
		if i == 0 {
			home = pool
		}
	}
	r, err := shard.New(ctx, shardName(0), shards, shard.Postgres(home))
	if err != nil {
		return err
	}
	f := newFreezer(cfg.ID, env.DB)
	var wg sync.WaitGroup
	wctx, cancel := context.WithCancel(ctx)
	defer func() { cancel(); wg.Wait() }()
	wg.Add(1)
	go func() { defer wg.Done(); f.watch(wctx) }()

	sink := withTopics(&attemptSink[pgx.Tx]{Sink: r, f: f, db: env.DB, id: cfg.ID}, r)
	handler := func(ctx context.Context, tx pgx.Tx, b *consumer.Batch) error {
		return ApplyBatch(ctx, PgTx(tx), b.Key.Partition, b.Token, cfg.ID, b.Records)
	}
	cons, err := consumer.New[pgx.Tx](cfg.Group, []string{cfg.Topic}, sink, handler,
		consumer.Kafka(cfg.kafkaOpts()...), consumer.Logger(cfg.Logger), groupProtocol(),
		consumer.RetryBackoff(20*time.Millisecond, 250*time.Millisecond))
	if err != nil {
		return err
	}
	return cons.Run(ctx)
}
