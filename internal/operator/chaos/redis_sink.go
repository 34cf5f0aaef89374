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

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/redisfence"
)

// The built-in workload with Redis as the sink (Config.RedisSink): the fenced workers fold the
// records into Redis through fence/redisfence, and the SQL database keeps only the run's logs
// (attempts, faults) for the harness. Each batch is one redisfence transaction: the per-key
// state, read with the client before the transaction (the naive read-modify-write of the SQL
// fold; a Tx only writes) and written back with HSET, and the batch's entry in the applied log,
// a stream, appended with XADD, both under the partition's fence in one script. So the state
// and the applied log in Redis are what the fence let through, and the harness copies them
// into chaos_state and chaos_applied (mirrorRedis) before the checker reads those, which it
// then judges as it judges a run on SQL.
//
// While the run goes on, the harness watches chaos_applied (a frozen worker's takeover, the
// backlog applied to its end): each worker also inserts there every batch its sink
// acknowledged. That live copy is replaced by Redis's log before the check.
//
// There is no outbox on Redis: the workload runs without commands.

// FaultRedisRestart kills the sink's Redis (Config.RedisSink) with SIGKILL and starts it again
// on its append-only file (Config.RedisRestart): every acknowledged fence advance and write
// must survive it. Runs with a Redis sink only.
const FaultRedisRestart FaultKind = "redis-restart"

// redisKeys names the run's keys in the sink's Redis: under the hash tag of the run's group
// and topic, so on a Redis Cluster a batch's writes share its fence's slot.
type redisKeys struct{ state, applied string }

func redisKeysOf(group, topic string) redisKeys {
	tag := "chaos:" + redisfence.HashTag(group, topic)
	return redisKeys{state: tag + ":state", applied: tag + ":applied"}
}

// redisDefaults checks and completes a run's Redis settings (Config.defaults calls it).
func (c *Config) redisDefaults() error {
	for _, f := range c.Faults {
		if f == FaultRedisRestart && (c.RedisSink == "" || c.RedisRestart == nil) {
			return fmt.Errorf("chaos: fault %s needs a Redis sink and a way to restart it (RedisSink, RedisRestart)", f)
		}
	}
	if c.RedisSink == "" {
		return nil
	}
	if c.App != nil || c.Mode != Fenced {
		return errors.New("chaos: the Redis sink runs the built-in workload, fenced")
	}
	c.Workload.CommandEvery = 0 // commands need an outbox
	for _, f := range c.Faults {
		if isTopicFault(f) || f == FaultDelay || f == FaultDBRestart || f == FaultTwoTopicInbox {
			return fmt.Errorf("chaos: fault %s does not run with a Redis sink", f)
		}
	}
	return nil
}

// redisRestart is FaultRedisRestart. It bites when the server came back as a new process
// (another run_id) holding every batch the applied log held before the kill.
func (h *harness) redisRestart(ctx context.Context, f *Fault) {
	f.Target = "redis " + h.cfg.RedisSink
	c := redis.NewClient(&redis.Options{Addr: h.cfg.RedisSink})
	defer c.Close()
	log := redisKeysOf(h.cfg.Group, h.cfg.Topic).applied
	runID := func() string {
		info, _ := c.Info(ctx, "server").Result()
		for _, l := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "run_id:"); ok {
				return v
			}
		}
		return ""
	}
	before, beforeID := c.XLen(ctx, log).Val(), runID()
	since := time.Now().UnixMilli()
	if err := h.cfg.RedisRestart(ctx); err != nil {
		f.Detail = err.Error()
		return
	}
	f.End = time.Now()
	after, afterID := c.XLen(ctx, log).Val(), runID()
	var failed int64
	_ = h.db.QueryRow(ctx, `SELECT count(*) FROM chaos_attempts WHERE outcome = $1 AND at_ms >= $2`, OutcomeError, since).Scan(&failed)
	f.Bit = beforeID != "" && afterID != "" && beforeID != afterID && after >= before && before > 0
	f.Detail = fmt.Sprintf("killed and restarted on its append-only file: %d batches in the applied log before, %d after; %d write attempts failed meanwhile", before, after, failed)
	if !f.Bit {
		f.Detail += fmt.Sprintf("; not proven (run_id %q, then %q)", beforeID, afterID)
	}
	sleep(ctx, h.cfg.SessionTimeout)
}

// mirrorRedis copies the sink's state and applied log into chaos_state and chaos_applied,
// replacing the workers' live copy of the log, for the checker. It does nothing without a
// Redis sink.
func (h *harness) mirrorRedis(ctx context.Context) error {
	if h.cfg.RedisSink == "" {
		return nil
	}
	c := redis.NewClient(&redis.Options{Addr: h.cfg.RedisSink})
	defer c.Close()
	k := redisKeysOf(h.cfg.Group, h.cfg.Topic)
	state, err := c.HGetAll(ctx, k.state).Result()
	if err != nil {
		return fmt.Errorf("chaos: read the Redis sink's state: %w", err)
	}
	for key, v := range state {
		st, err := parseKeyState(v)
		if err != nil {
			return fmt.Errorf("chaos: the Redis sink's state of %s: %w", key, err)
		}
		if err := h.db.Exec(ctx, `INSERT INTO chaos_state (k, n, last_seq, sum_seq, disorder) VALUES ($1, $2, $3, $4, $5)`,
			key, st.n, st.last, st.sum, st.disorder); err != nil {
			return err
		}
	}
	log, err := c.XRange(ctx, k.applied, "-", "+").Result()
	if err != nil {
		return fmt.Errorf("chaos: read the Redis sink's applied log: %w", err)
	}
	if err := h.db.Exec(ctx, `DELETE FROM chaos_applied`); err != nil {
		return err
	}
	for _, m := range log {
		r, err := parseRedisApplied(m)
		if err != nil {
			return err
		}
		if err := h.db.Exec(ctx, `INSERT INTO chaos_applied (topic, part, first_off, last_off, era, epoch, worker, at_ms, produced_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
			r.topic, r.part, r.first, r.last, r.era, r.epoch, r.worker, r.at, r.produced); err != nil {
			return err
		}
	}
	h.progress("copied the Redis sink's state (%d keys) and applied log (%d batches) for the check", len(state), len(log))
	return nil
}

// redisApplied returns the fields of a batch's entry in the sink's applied log.
func redisApplied(topic string, part int32, tok fence.Token, worker string, recs []*kgo.Record, atMS int64) []string {
	return []string{"topic", topic, "part", strconv.Itoa(int(part)),
		"first", strconv.FormatInt(recs[0].Offset, 10), "last", strconv.FormatInt(recs[len(recs)-1].Offset, 10),
		"era", strconv.FormatInt(tok.Era, 10), "epoch", strconv.FormatInt(tok.Epoch, 10),
		"worker", worker, "at_ms", strconv.FormatInt(atMS, 10), "produced_ms", strconv.FormatInt(producedMS(recs), 10)}
}

// parseRedisApplied reads an entry of the sink's applied log (an entry without produced_ms
// has it 0, unknown).
func parseRedisApplied(m redis.XMessage) (appliedRow, error) {
	var v [7]int64
	for i, f := range []string{"part", "first", "last", "era", "epoch", "at_ms", "produced_ms"} {
		s := field(m, f)
		if s == "" && f == "produced_ms" {
			continue
		}
		var err error
		if v[i], err = strconv.ParseInt(s, 10, 64); err != nil {
			return appliedRow{}, fmt.Errorf("chaos: the Redis sink's applied log, entry %s: %s: %w", m.ID, f, err)
		}
	}
	return appliedRow{topic: field(m, "topic"), worker: field(m, "worker"), part: int32(v[0]),
		first: v[1], last: v[2], era: v[3], epoch: v[4], at: v[5], produced: v[6]}, nil
}

func field(m redis.XMessage, name string) string {
	v, _ := m.Values[name].(string)
	return v
}

// A key's state in the sink's hash: "n,last,sum,disorder".
func (s keyState) String() string { return fmt.Sprintf("%d,%d,%d,%d", s.n, s.last, s.sum, s.disorder) }

func parseKeyState(v string) (keyState, error) {
	p := strings.Split(v, ",")
	if len(p) != 4 {
		return keyState{}, fmt.Errorf("%q: want n,last,sum,disorder", v)
	}
	var n [4]int64
	for i := range p {
		var err error
		if n[i], err = strconv.ParseInt(p[i], 10, 64); err != nil {
			return keyState{}, fmt.Errorf("%q: %w", v, err)
		}
	}
	return keyState{n: n[0], last: n[1], sum: n[2], disorder: n[3]}, nil
}

// runRedisSink runs a fenced worker of the built-in workload over the Redis at addr, with the
// harness's fault points and attempt log around every write (attemptSink) and the live copy of
// the applied log in env.DB.
func runRedisSink(ctx context.Context, cfg WorkerConfig, env AppEnv, addr string) error {
	if err := cfg.defaults(); err != nil {
		return err
	}
	if cfg.Mode != Fenced {
		return fmt.Errorf("%w: the Redis sink runs fenced", ErrUsage)
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	store, err := redisfence.New(c) // the run's server must keep what it acknowledges
	if err != nil {
		return err
	}
	f := newFreezer(cfg.ID, env.DB)
	var wg sync.WaitGroup
	wctx, cancel := context.WithCancel(ctx)
	defer func() { cancel(); wg.Wait() }()
	wg.Add(1)
	go func() { defer wg.Done(); f.watch(wctx) }()

	k := redisKeysOf(cfg.Group, cfg.Topic)
	sink := liveApplied{Sink: &attemptSink[*redisfence.Tx]{Sink: store, f: f, db: env.DB, id: cfg.ID}, Topics: store, db: env.DB, id: cfg.ID}
	handler := func(ctx context.Context, tx *redisfence.Tx, b *consumer.Batch) error {
		return foldRedis(ctx, c, tx, k, b.Key.Partition, b.Token, cfg.ID, b.Records)
	}
	cons, err := consumer.New[*redisfence.Tx](cfg.Group, []string{cfg.Topic}, sink, handler,
		consumer.Kafka(cfg.kafkaOpts()...), consumer.Logger(cfg.Logger), groupProtocol(),
		consumer.RetryBackoff(20*time.Millisecond, 250*time.Millisecond))
	if err != nil {
		return err
	}
	return cons.Run(ctx)
}

// foldRedis is fold and logApplied on Redis: it reads the batch's keys' states with c, folds
// the records into them, and queues on tx the states written back and the batch's entry in
// the applied log.
func foldRedis(ctx context.Context, c *redis.Client, tx *redisfence.Tx, k redisKeys, part int32, tok fence.Token, worker string, recs []*kgo.Record) error {
	if len(recs) == 0 {
		return nil
	}
	var order []string
	seqs := make([]int64, len(recs))
	for i, r := range recs {
		seq, err := strconv.ParseInt(string(r.Value), 10, 64)
		if err != nil || len(r.Key) == 0 {
			return fmt.Errorf("%w: offset %d", errBadRecord, r.Offset)
		}
		seqs[i] = seq
		if !slices.Contains(order, string(r.Key)) {
			order = append(order, string(r.Key))
		}
	}
	stored, err := c.HMGet(ctx, k.state, order...).Result()
	if err != nil {
		return err
	}
	states := map[string]*keyState{}
	for i, key := range order {
		st := keyState{last: -1}
		if v, ok := stored[i].(string); ok {
			if st, err = parseKeyState(v); err != nil {
				return fmt.Errorf("chaos: state of %s: %w", key, err)
			}
		}
		states[key] = &st
	}
	for i, r := range recs {
		st := states[string(r.Key)]
		if seqs[i] != st.last+1 {
			st.disorder++
		}
		st.n++
		st.sum += seqs[i]
		st.last = seqs[i]
	}
	fv := make([]string, 0, 2*len(order))
	for _, key := range order {
		fv = append(fv, key, states[key].String())
	}
	tx.HSet(k.state, fv...)
	tx.XAdd(k.applied, redisApplied(recs[0].Topic, part, tok, worker, recs, time.Now().UnixMilli())...)
	return nil
}

// liveApplied is the Redis worker's sink: attemptSink, keeping the store's topic identities,
// and after each acknowledged batch its row in chaos_applied, the harness's live view (which
// does not see the records: produced_ms stays 0 there until mirrorRedis copies the log).
type liveApplied struct {
	fence.Sink[*redisfence.Tx]
	fence.Topics
	db DB
	id string
}

func (s liveApplied) Apply(ctx context.Context, k fence.Key, t fence.Token, first, last int64, fn func(context.Context, *redisfence.Tx) error) error {
	err := s.Sink.Apply(ctx, k, t, first, last, fn)
	if err == nil {
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = s.db.Exec(lctx, `INSERT INTO chaos_applied (topic, part, first_off, last_off, era, epoch, worker, at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
			k.Topic, k.Partition, first, last, t.Era, t.Epoch, s.id, time.Now().UnixMilli())
	}
	return err
}
