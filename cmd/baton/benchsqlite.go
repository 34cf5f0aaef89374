package main

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"time"

	"github.com/batonhq/baton/cmd/baton/internal/bench"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/fence/sqlitefence/sqlitebulk"
)

// sqliteDesigns are the bench's designs that fold into SQLite: Baton fenced with the fast
// write path, the same handler unfenced, and SQLite's ceiling. Every one opens its file with
// sqlitefence.Open (WAL, synchronous=FULL, BEGIN IMMEDIATE), so they differ only in what
// they run.
func sqliteDesigns() map[string]bench.Design {
	return map[string]bench.Design{
		"sqlite-fast": func(ctx context.Context, job bench.Job, rec *bench.Recorder) error {
			return runSQLite(ctx, job, rec, true)
		},
		"sqlite-unfenced": func(ctx context.Context, job bench.Job, rec *bench.Recorder) error {
			return runSQLite(ctx, job, rec, false)
		},
		"sqlite-ceiling": sqliteCeiling,
	}
}

// openFold opens the job's SQLite file and the fold's prepared upsert.
func openFold(ctx context.Context, job bench.Job) (*sqlitefence.Store, *sqlitebulk.Upsert, error) {
	s, err := sqlitefence.Open(job.SQLite)
	if err != nil {
		return nil, nil, err
	}
	if _, err := s.DB().ExecContext(ctx, bench.FoldTableSQLite); err != nil {
		s.Close()
		return nil, nil, err
	}
	cols := make([]sqlitebulk.Column, len(bench.FoldColumns))
	for i, c := range bench.FoldColumns {
		cols[i] = sqlitebulk.Column{Name: c[0]}
	}
	up, err := sqlitebulk.NewUpsert(bench.Table, []string{"key"}, cols, bench.FoldSetSQLite, sqlitebulk.Merge(bench.MergeFold))
	if err == nil {
		err = up.Prepare(ctx, s.DB())
	}
	if err != nil {
		s.Close()
		return nil, nil, err
	}
	return s, up, nil
}

func runSQLite(ctx context.Context, job bench.Job, rec *bench.Recorder, fenced bool) error {
	s, up, err := openFold(ctx, job)
	if err != nil {
		return err
	}
	defer s.Close()
	defer up.Close()
	var sink fence.Sink[*sql.Tx] = s
	if !fenced {
		sink = unfencedSQLite{s.DB()}
	}
	factory := func(context.Context, fence.Key, fence.Token) (consumer.Handler[*sql.Tx], error) {
		return consumer.Handler[*sql.Tx](func(ctx context.Context, tx *sql.Tx, b *consumer.Batch) error {
			rows := make([][]any, len(b.Records))
			for i, r := range b.Records {
				v, err := bench.Value(r.Value)
				if err != nil {
					return consumer.Permanent(err)
				}
				rows[i] = bench.FoldRow(string(r.Key), v)
			}
			return up.Exec(ctx, tx, rows)
		}), nil
	}
	logger, kopts, closeLog, err := benchLogging(job, rec)
	if err != nil {
		return err
	}
	defer closeLog()
	rec.Start()
	c, err := consumer.New(job.Group, []string{job.Topic}, counting[*sql.Tx](sink, rec), nil, consumer.PerPartition(factory),
		consumer.Kafka(kopts...), consumer.Logger(logger))
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

// sqliteCeiling writes the records, generated in memory and split by partition as the
// producer split them, in 1000-record chunks merged per key, one transaction per chunk, by
// one writer (SQLite admits one at a time; more connections only queue for its lock).
func sqliteCeiling(ctx context.Context, job bench.Job, rec *bench.Recorder) error {
	s, up, err := openFold(ctx, job)
	if err != nil {
		return err
	}
	defer s.Close()
	defer up.Close()
	parts := bench.Partitioned(job)
	rec.Start()
	for _, recs := range parts {
		for len(recs) > 0 {
			n := min(len(recs), bench.Chunk)
			start := time.Now()
			tx, err := s.DB().BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			if err := up.Exec(ctx, tx, recs[:n]); err != nil {
				_ = tx.Rollback()
				return err
			}
			if err := tx.Commit(); err != nil {
				return err
			}
			rec.Committed(int64(n), time.Since(start))
			recs = recs[n:]
		}
	}
	<-ctx.Done()
	return nil
}

// unfencedSQLite keeps no fence: every Apply is BEGIN IMMEDIATE, fn, COMMIT. It protects
// nothing; it prices the fence.
type unfencedSQLite struct{ db *sql.DB }

func (unfencedSQLite) Claim(context.Context, fence.Key, fence.Token, string) (fence.State, error) {
	return fence.State{Position: fence.NoPosition}, nil
}

func (unfencedSQLite) Load(context.Context, fence.Key) (fence.State, error) {
	return fence.State{Position: fence.NoPosition}, nil
}

// gate serializes the unfenced transactions within the process as sqlitefence does its own,
// so that the comparison prices the fence, not SQLite's busy handler.
var gate sync.Mutex

func (s unfencedSQLite) Apply(ctx context.Context, _ fence.Key, _ fence.Token, _, _ int64, fn func(context.Context, *sql.Tx) error) error {
	gate.Lock()
	defer gate.Unlock()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if err := fn(ctx, tx); err != nil {
		return err
	}
	return tx.Commit()
}

func (unfencedSQLite) Advance(context.Context, *sql.Tx, fence.Key, fence.Token, int64, int64) error {
	return nil
}

func (unfencedSQLite) Recover(context.Context, fence.Key, fence.Token, int64, string, string) (fence.Token, error) {
	return fence.Token{}, errors.New("unfenced sink: nothing to recover")
}

func (unfencedSQLite) Recoveries(context.Context, fence.Key) ([]fence.Recovery, error) {
	return nil, nil
}
