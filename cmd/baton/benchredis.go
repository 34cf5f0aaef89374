package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/batonhq/baton/cmd/baton/internal/bench"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/redisfence"
	"github.com/redis/go-redis/v9"
)

// redisDesigns are the bench's designs that fold into Redis: Baton fenced by redisfence, and
// the same handler over a sink without a fence whose batch is one MULTI/EXEC pipeline. Both
// run on the server's settings as they are (redisFold.Settings reports them).
func redisDesigns() map[string]bench.Design {
	return map[string]bench.Design{
		"redis-fast": func(ctx context.Context, job bench.Job, rec *bench.Recorder) error {
			return runRedis(ctx, job, rec, true)
		},
		"redis-unfenced": func(ctx context.Context, job bench.Job, rec *bench.Recorder) error {
			return runRedis(ctx, job, rec, false)
		},
	}
}

// hsetter is what the fold's handler needs of a transaction: redisfence's Tx, or a pipeline.
type hsetter interface {
	HSet(key string, fieldValues ...string)
}

// redisFoldHandler merges the batch's records per key, reads the stored folds of its keys in
// one pipeline (a handler reads before it queues: a Tx only writes; the partition's owner is
// the only writer of its keys, and a zombie's batch is refused whole by the fence), and
// queues one HSET per key with the merged fold.
func redisFoldHandler[Tx hsetter](c redis.Cmdable, job bench.Job) consumer.Factory[Tx] {
	return func(context.Context, fence.Key, fence.Token) (consumer.Handler[Tx], error) {
		return func(ctx context.Context, tx Tx, b *consumer.Batch) error {
			at := make(map[string]int, len(b.Records))
			var rows [][]any
			for _, r := range b.Records {
				v, err := bench.Value(r.Value)
				if err != nil {
					return consumer.Permanent(err)
				}
				row := bench.FoldRow(string(r.Key), v)
				if i, ok := at[string(r.Key)]; ok {
					bench.MergeFold(rows[i], row)
					continue
				}
				at[string(r.Key)] = len(rows)
				rows = append(rows, row)
			}
			stored := make([]*redis.SliceCmd, len(rows))
			_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i, row := range rows {
					stored[i] = p.HMGet(ctx, job.RedisKey(row[0].(string)), bench.RedisFields...)
				}
				return nil
			})
			if err != nil {
				return err
			}
			for i, row := range rows {
				key := row[0].(string)
				if prev, found, err := parseFold(stored[i].Val()); err != nil {
					return err
				} else if found {
					bench.MergeFold(prev, row)
					row = prev
				}
				fv := make([]string, 0, 2*len(bench.RedisFields))
				for j, f := range bench.RedisFields {
					fv = append(fv, f, strconv.FormatInt(row[j+1].(int64), 10))
				}
				tx.HSet(job.RedisKey(key), fv...)
			}
			return nil
		}, nil
	}
}

// parseFold reads a fold's hash fields (bench.RedisFields order) as a fold row whose key is
// empty; found is false for a key not written yet.
func parseFold(vals []any) (row []any, found bool, err error) {
	row = []any{""}
	for i, v := range vals {
		s, ok := v.(string)
		if !ok {
			if i == 0 {
				return nil, false, nil
			}
			return nil, false, fmt.Errorf("fold hash: field %s missing", bench.RedisFields[i])
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, false, fmt.Errorf("fold hash: %s: %w", bench.RedisFields[i], err)
		}
		row = append(row, n)
	}
	return row, true, nil
}

func redisClient(job bench.Job) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: job.Redis, PoolSize: 2 * job.Partitions})
}

func runRedis(ctx context.Context, job bench.Job, rec *bench.Recorder, fenced bool) error {
	if tag := redisfence.HashTag(job.Group, job.Topic); !strings.Contains(job.RedisKey("k"), tag) {
		return fmt.Errorf("fold key %q lacks the fences' hash tag %s", job.RedisKey("k"), tag)
	}
	c := redisClient(job)
	defer c.Close()
	if err := c.Ping(ctx).Err(); err != nil {
		return err
	}
	logger, kopts, closeLog, err := benchLogging(job, rec)
	if err != nil {
		return err
	}
	defer closeLog()
	if !fenced {
		rec.Start()
		cons, err := consumer.New(job.Group, []string{job.Topic}, counting[*pipeTx](unfencedRedis{c}, rec), nil,
			consumer.PerPartition(redisFoldHandler[*pipeTx](c, job)), consumer.Kafka(kopts...), consumer.Logger(logger))
		if err != nil {
			return err
		}
		return cons.Run(ctx)
	}
	s, err := durableOrNot(ctx, c)
	if err != nil {
		return err
	}
	rec.Start()
	cons, err := consumer.New(job.Group, []string{job.Topic}, counting[*redisfence.Tx](s, rec), nil,
		consumer.PerPartition(redisFoldHandler[*redisfence.Tx](c, job)), consumer.Kafka(kopts...), consumer.Logger(logger))
	if err != nil {
		return err
	}
	return cons.Run(ctx)
}

// durableOrNot returns a store on c: as it is if the server's settings keep every
// acknowledged write, with AllowLosingAcknowledgedWrites if they do not (the bench measures
// the server it is given; the run prints its settings).
func durableOrNot(ctx context.Context, c *redis.Client) (*redisfence.Store, error) {
	s, err := redisfence.New(c)
	if err != nil {
		return nil, err
	}
	err = s.Check(ctx)
	if !errors.Is(err, redisfence.ErrNotDurable) {
		return s, err
	}
	s, err = redisfence.New(c, redisfence.AllowLosingAcknowledgedWrites())
	if err != nil {
		return nil, err
	}
	return s, s.Check(ctx)
}

// pipeTx queues the handler's commands on a MULTI/EXEC pipeline.
type pipeTx struct {
	ctx context.Context
	p   redis.Pipeliner
}

func (t *pipeTx) HSet(key string, fieldValues ...string) {
	args := make([]any, len(fieldValues))
	for i, v := range fieldValues {
		args[i] = v
	}
	t.p.HSet(t.ctx, key, args...)
}

// unfencedRedis keeps no fence: every claim starts from Kafka's committed offset and every
// Apply sends the handler's commands as one MULTI/EXEC pipeline. It protects nothing; it
// prices the fence.
type unfencedRedis struct{ c *redis.Client }

func (unfencedRedis) Claim(context.Context, fence.Key, fence.Token, string) (fence.State, error) {
	return fence.State{Position: fence.NoPosition}, nil
}

func (unfencedRedis) Load(context.Context, fence.Key) (fence.State, error) {
	return fence.State{Position: fence.NoPosition}, nil
}

func (s unfencedRedis) Apply(ctx context.Context, _ fence.Key, _ fence.Token, _, _ int64, fn func(context.Context, *pipeTx) error) error {
	p := s.c.TxPipeline()
	if err := fn(ctx, &pipeTx{ctx: ctx, p: p}); err != nil {
		p.Discard()
		return err
	}
	_, err := p.Exec(ctx)
	return err
}

func (unfencedRedis) Advance(context.Context, *pipeTx, fence.Key, fence.Token, int64, int64) error {
	return nil
}

func (unfencedRedis) Recover(context.Context, fence.Key, fence.Token, int64, string, string) (fence.Token, error) {
	return fence.Token{}, errors.New("unfenced sink: nothing to recover")
}

func (unfencedRedis) Recoveries(context.Context, fence.Key) ([]fence.Recovery, error) {
	return nil, nil
}

// redisFold is the harness's access to the redis- designs' fold on the server at addr.
type redisFold struct{ addr string }

var _ bench.RedisFold = redisFold{}

// Settings reads the settings that decide whether an acknowledged write survives, and
// whether redisfence accepts them.
func (f redisFold) Settings(ctx context.Context) (string, error) {
	c := redis.NewClient(&redis.Options{Addr: f.addr})
	defer c.Close()
	var parts []string
	for _, p := range []string{"appendonly", "appendfsync", "no-appendfsync-on-rewrite", "maxmemory-policy"} {
		m, err := c.ConfigGet(ctx, p).Result()
		if err != nil {
			return "", err
		}
		parts = append(parts, p+" "+m[p])
	}
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_slaves:"); ok {
			parts = append(parts, v+" replica(s)")
		}
	}
	s, err := redisfence.New(c)
	if err != nil {
		return "", err
	}
	verdict := "durable for redisfence: redis-fast runs without options"
	if !strings.Contains(info, "connected_slaves:0") {
		verdict += ", and waits for the replicas (WAIT) on every batch"
	}
	if err := s.Check(ctx); errors.Is(err, redisfence.ErrNotDurable) {
		verdict = "can lose acknowledged writes: redis-fast runs with AllowLosingAcknowledgedWrites"
	} else if err != nil {
		return "", err
	}
	return strings.Join(parts, ", ") + "; " + verdict, nil
}

// Check reads every key's fold hash in one pipeline and checks it.
func (f redisFold) Check(ctx context.Context, job bench.Job) error {
	c := redis.NewClient(&redis.Options{Addr: f.addr})
	defer c.Close()
	cmds := make([]*redis.SliceCmd, job.Keys)
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for k := range job.Keys {
			cmds[k] = p.HMGet(ctx, job.RedisKey(fmt.Sprintf("k%05d", k)), bench.RedisFields...)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("check: %w", err)
	}
	folds := map[string][]int64{}
	for k, cmd := range cmds {
		row, found, err := parseFold(cmd.Val())
		if err != nil {
			return fmt.Errorf("check: %w", err)
		}
		if !found {
			continue
		}
		f := make([]int64, len(row)-1)
		for i := range f {
			f[i] = row[i+1].(int64)
		}
		folds[fmt.Sprintf("k%05d", k)] = f
	}
	return bench.CheckFold(job.Keys, job.PerKey(), folds)
}

// Clean deletes the job's keys: every key with its hash tag {group/topic}, its fold's and
// the store's fences alike.
func (f redisFold) Clean(ctx context.Context, job bench.Job) error {
	c := redis.NewClient(&redis.Options{Addr: f.addr})
	defer c.Close()
	it := c.Scan(ctx, 0, "*"+redisfence.HashTag(job.Group, job.Topic)+"*", 1000).Iterator()
	var batch []string
	for it.Next(ctx) {
		batch = append(batch, it.Val())
		if len(batch) == 1000 {
			if err := c.Del(ctx, batch...).Err(); err != nil {
				return err
			}
			batch = batch[:0]
		}
	}
	if err := it.Err(); err != nil {
		return err
	}
	if len(batch) > 0 {
		return c.Del(ctx, batch...).Err()
	}
	return nil
}
