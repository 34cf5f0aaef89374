package main

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/batonhq/baton/cmd/baton/internal/bench"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/fence/pgfence/pgbulk"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/internal/readme"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

// batonDesigns are the bench's designs that run Baton: the README's program, its handler
// shape on PostgreSQL pipelined and not, the fast write path, fenced, and the fast path over a
// sink without a fence.
//
// This file and benchcounting.go are the bench's only users of fence.Sink: countingSink,
// syncSink and unfencedSink here, the wrapper that keeps a counted sink's fence.Topics there.
func batonDesigns() map[string]bench.Design {
	return map[string]bench.Design{
		"baton": runReadme,
		"baton-pg": func(ctx context.Context, job bench.Job, rec *bench.Recorder) error {
			return runBaton(ctx, job, rec, "pgfence", rowPerRecord)
		},
		"baton-pg-sync": func(ctx context.Context, job bench.Job, rec *bench.Recorder) error {
			return runBaton(ctx, job, rec, "sync", rowPerRecord)
		},
		"baton-fast": func(ctx context.Context, job bench.Job, rec *bench.Recorder) error {
			return runBaton(ctx, job, rec, "pgbulk", fastPath)
		},
		"baton-unfenced": func(ctx context.Context, job bench.Job, rec *bench.Recorder) error {
			return runBaton(ctx, job, rec, "none", fastPath)
		},
	}
}

// runReadme runs the README's program's handler (readme.ApplyTwinUpdates) as the README's
// program does, over the store it opens (sqlitefence.Open), on the job's topic and group.
func runReadme(ctx context.Context, job bench.Job, rec *bench.Recorder) error {
	store, err := sqlitefence.Open(job.SQLite)
	if err != nil {
		return err
	}
	defer store.Close()
	logger, kopts, closeLog, err := benchLogging(job, rec)
	if err != nil {
		return err
	}
	defer closeLog()
	rec.Start()
	c, err := consumer.New(job.Group, []string{job.Topic}, counting[*sql.Tx](store, rec),
		func(ctx context.Context, tx *sql.Tx, b *consumer.Batch) error {
			return readme.ApplyTwinUpdates(ctx, tx, b.Records)
		},
		consumer.Kafka(kopts...), consumer.Logger(logger))
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

// rowPerRecord is the README's handler shape on PostgreSQL: one statement per record in the
// batch's transaction.
func rowPerRecord(context.Context, fence.Key, fence.Token) (consumer.Handler[pgx.Tx], error) {
	return consumer.Handler[pgx.Tx](func(ctx context.Context, tx pgx.Tx, b *consumer.Batch) error {
		for _, r := range b.Records {
			v, err := bench.Value(r.Value)
			if err != nil {
				return consumer.Permanent(err)
			}
			if _, err := tx.Exec(ctx, bench.FoldUpsert, string(r.Key), v); err != nil {
				return err
			}
		}
		return nil
	}), nil
}

var foldUpsert = func() *pgbulk.Upsert {
	cols := make([]pgbulk.Column, len(bench.FoldColumns))
	for i, c := range bench.FoldColumns {
		cols[i] = pgbulk.Column{Name: c[0], Type: c[1]}
	}
	up, err := pgbulk.NewUpsert(bench.Table, []string{"key"}, cols, bench.FoldSet, pgbulk.Merge(bench.MergeFold))
	if err != nil {
		panic(err)
	}
	return up
}()

// fastPath is the same fold through pgbulk: the batch's records merged per key and written
// by unnest statements of at most 1000 rows, in one batch (over pgbulk.Sink, the batch that
// also carries the fence statement).
func fastPath(context.Context, fence.Key, fence.Token) (consumer.Handler[pgx.Tx], error) {
	return consumer.Handler[pgx.Tx](func(ctx context.Context, tx pgx.Tx, b *consumer.Batch) error {
		rows := make([][]any, len(b.Records))
		for i, r := range b.Records {
			v, err := bench.Value(r.Value)
			if err != nil {
				return consumer.Permanent(err)
			}
			rows[i] = bench.FoldRow(string(r.Key), v)
		}
		return foldUpsert.Exec(ctx, tx, rows)
	}), nil
}

// runBaton runs a consumer over sink ("pgfence", "pgbulk": pgfence with the fence pipelined
// into the handler's first batch, "sync": pgfence's Advance in a transaction of the bench's,
// which does not pipeline, or "none").
func runBaton(ctx context.Context, job bench.Job, rec *bench.Recorder, sinkKind string, factory consumer.Factory[pgx.Tx]) error {
	pool, err := job.Pool(ctx, job.Partitions)
	if err != nil {
		return err
	}
	defer pool.Close()
	var sink fence.Sink[pgx.Tx] = unfencedSink{pool}
	if sinkKind != "none" {
		s, err := pgfence.New(pool)
		if err != nil {
			return err
		}
		if err := s.Migrate(ctx); err != nil {
			return err
		}
		sink = s
		switch sinkKind {
		case "pgbulk":
			if sink, err = pgbulk.NewSink(s, pool); err != nil {
				return err
			}
		case "sync":
			sink = syncSink{Store: s, pool: pool}
		}
	}
	if err := bench.Warm(ctx, pool); err != nil {
		return err
	}
	logger, kopts, closeLog, err := benchLogging(job, rec)
	if err != nil {
		return err
	}
	defer closeLog()
	rec.Start()
	c, err := consumer.New(job.Group, []string{job.Topic}, counting[pgx.Tx](sink, rec), nil, consumer.PerPartition(factory),
		consumer.Kafka(kopts...), consumer.Logger(logger))
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

// countingSink times each committed Apply (begin to commit) and counts its records from the
// advance of the partition's position (with 'baton bench latency', times each one too): the
// topic's offsets are dense, every group is new and every fence fresh, so a partition starts
// at offset 0. Build it with counting, which keeps the counted sink's fence.Topics.
type countingSink[Tx any] struct {
	fence.Sink[Tx]
	rec *bench.Recorder
	mu  sync.Mutex
	pos map[int32]int64 // last applied offset per partition
}

func (s *countingSink[Tx]) Apply(ctx context.Context, k fence.Key, t fence.Token, first, position int64, fn func(context.Context, Tx) error) error {
	s.rec.Phase(bench.PhaseApplying, false)
	start := time.Now()
	if err := s.Sink.Apply(ctx, k, t, first, position, fn); err != nil {
		return err
	}
	d := time.Since(start)
	s.mu.Lock()
	prev, ok := s.pos[k.Partition]
	if !ok {
		prev = -1
	}
	s.pos[k.Partition] = position
	s.mu.Unlock()
	s.rec.CommittedRange(k.Partition, prev+1, position, d)
	return nil
}

// Claim is the sink's, noting when the last partition's fence was claimed (a phase before the
// first commit).
func (s *countingSink[Tx]) Claim(ctx context.Context, k fence.Key, t fence.Token, claimant string) (fence.State, error) {
	st, err := s.Sink.Claim(ctx, k, t, claimant)
	if err == nil {
		s.rec.Phase(bench.PhaseClaimed, true)
	}
	return st, err
}

// syncSink is pgfence's Apply without its pipelining transaction: begin, the store's Advance,
// fn with the transaction itself (each Exec a round trip), commit.
type syncSink struct {
	*pgfence.Store
	pool *pgxpool.Pool
}

func (s syncSink) Apply(ctx context.Context, k fence.Key, t fence.Token, first, last int64, fn func(context.Context, pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := s.Advance(ctx, tx, k, t, first, last); err != nil {
			return err
		}
		return fn(ctx, tx)
	})
}

// unfencedSink keeps no fence: every claim starts from Kafka's committed offset and every
// Apply is begin, fn, commit. It protects nothing; it prices the fence.
type unfencedSink struct{ pool *pgxpool.Pool }

func (unfencedSink) Claim(context.Context, fence.Key, fence.Token, string) (fence.State, error) {
	return fence.State{Position: fence.NoPosition}, nil
}

func (unfencedSink) Load(context.Context, fence.Key) (fence.State, error) {
	return fence.State{Position: fence.NoPosition}, nil
}

func (s unfencedSink) Apply(ctx context.Context, _ fence.Key, _ fence.Token, _, _ int64, fn func(context.Context, pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { return fn(ctx, tx) })
}

func (unfencedSink) Advance(context.Context, pgx.Tx, fence.Key, fence.Token, int64, int64) error {
	return nil
}

func (unfencedSink) Recover(context.Context, fence.Key, fence.Token, int64, string, string) (fence.Token, error) {
	return fence.Token{}, errors.New("unfenced sink: nothing to recover")
}

func (unfencedSink) Recoveries(context.Context, fence.Key) ([]fence.Recovery, error) {
	return nil, nil
}

// benchLogging returns the consumer's logger and Kafka options: quiet, or with job.Profile
// set, the runtime's and the Kafka client's debug timeline into a file beside the profile.
func benchLogging(job bench.Job, rec *bench.Recorder) (*slog.Logger, []kgo.Opt, func(), error) {
	kopts := []kgo.Opt{kgo.SeedBrokers(job.Brokers...), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.WithHooks(fetchCount{rec})}
	kopts = append(kopts, job.ConsumerTiming(rec)...)
	if job.Profile == "" {
		return quietLogger, kopts, func() {}, nil
	}
	f, err := os.Create(filepath.Join(job.Profile, job.Design+"-"+time.Now().UTC().Format("150405.000")+".log"))
	if err != nil {
		return nil, nil, nil, err
	}
	logger := slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelDebug}))
	logger.Info("start")
	return logger, append(kopts, kgo.WithLogger(kslog{logger})), func() { f.Close() }, nil
}

// fetchCount counts the records the Kafka client decodes (Report.Fetched).
type fetchCount struct{ rec *bench.Recorder }

func (f fetchCount) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.FetchBatchMetrics) {
	f.rec.Fetched(int64(m.NumRecords))
}

// kslog is the Kafka client's debug log into the profile's log.
type kslog struct{ l *slog.Logger }

func (k kslog) Level() kgo.LogLevel { return kgo.LogLevelDebug }
func (k kslog) Log(level kgo.LogLevel, msg string, kv ...any) {
	k.l.Debug("kgo: "+msg, kv...)
}
