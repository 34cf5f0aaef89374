package pgfence

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/fencecheck"
)

var _ fence.Topics = (*Store)(nil)

func (s *Store) prepareTopicSQL(f, r, tp string) {
	s.sqlRecoveryInsert = fmt.Sprintf(`INSERT INTO %s (group_id, topic, partition, from_era, from_epoch, to_era, to_epoch, reason)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, r)
	s.sqlTopicLoad = fmt.Sprintf(`SELECT seq, topic_id, partitions FROM %s WHERE group_id = $1 AND topic = $2 ORDER BY seq DESC LIMIT 1`, tp)
	// Appending seq+1 is the compare-and-set: of two writers that read the same latest row,
	// the second conflicts on the primary key and inserts nothing.
	s.sqlTopicInsert = fmt.Sprintf(`INSERT INTO %s (group_id, topic, seq, topic_id, partitions, reason)
VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING`, tp)
	s.sqlTopicHistory = fmt.Sprintf(`SELECT seq, topic_id, partitions, reason, at FROM %s WHERE group_id = $1 AND topic = $2 ORDER BY seq`, tp)
	// Locks the topic's existing fences: a reset waits for the transactions writing them.
	s.sqlTopicLock = fmt.Sprintf(`SELECT partition, era, epoch FROM %s WHERE group_id = $1 AND topic = $2 ORDER BY partition FOR UPDATE`, f)
	// A missing fence is inserted at era 1 (from the zero token); an existing one, including
	// one a racing first claim inserted meanwhile, moves to its next era. A sealed fence
	// (epoch $5, fencecheck.SealedEpoch) keeps its epoch and claimant.
	s.sqlTopicReset = fmt.Sprintf(`INSERT INTO %[1]s AS f (group_id, topic, partition, era, epoch, position, claimant, updated_at)
VALUES ($1, $2, $3, $4, 0, -1, '', now())
ON CONFLICT (group_id, topic, partition) DO UPDATE
SET era = f.era + 1, position = -1, updated_at = now(),
	epoch = CASE WHEN f.epoch = $5 THEN f.epoch ELSE 0 END,
	claimant = CASE WHEN f.epoch = $5 THEN f.claimant ELSE '' END
RETURNING f.era, f.epoch`, f)
}

func validText(what, s string) error {
	if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
		return fmt.Errorf("%w: pgfence: %s must be UTF-8 without NUL bytes", fence.ErrInvalid, what)
	}
	return nil
}

func (s *Store) loadTopic(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, group, topic string) (t fence.Topic, seq int64, found bool, err error) {
	err = q.QueryRow(ctx, s.sqlTopicLoad, group, topic).Scan(&seq, &t.ID, &t.Partitions)
	if errors.Is(err, pgx.ErrNoRows) {
		return fence.Topic{}, 0, false, nil
	}
	return t, seq, err == nil, err
}

// SeeTopic implements [fence.Topics.SeeTopic]: a read and, to adopt, an append that loses to
// any concurrent one (then the winner's record is read and returned).
func (s *Store) SeeTopic(ctx context.Context, group, topic string, seen fence.Topic, reason string) (fence.Topic, bool, error) {
	if err := fencecheck.ValidateTopic(group, topic, seen); err != nil {
		return fence.Topic{}, false, err
	}
	if reason == "" {
		return fence.Topic{}, false, fmt.Errorf("%w: adopting a topic needs a reason", fence.ErrInvalid)
	}
	if err := validText("reason", reason); err != nil {
		return fence.Topic{}, false, err
	}
	for range maxAttempts {
		cur, seq, found, err := s.loadTopic(ctx, s.db, group, topic)
		if err != nil {
			return fence.Topic{}, false, fmt.Errorf("pgfence: see topic %s/%s: %w", group, topic, notMigrated(err))
		}
		// The key only names the topic here; the partition rule does not apply to an adoption.
		adopt, _ := fencecheck.CheckTopic(fence.Key{Group: group, Topic: topic}, cur, found, seen)
		if adopt == nil {
			return cur, false, nil
		}
		tag, err := s.db.Exec(ctx, s.sqlTopicInsert, group, topic, seq+1, adopt.ID, adopt.Partitions, reason)
		if err != nil {
			return fence.Topic{}, false, fmt.Errorf("pgfence: see topic %s/%s: %w", group, topic, err)
		}
		if tag.RowsAffected() == 1 {
			return *adopt, true, nil
		}
	}
	return fence.Topic{}, false, fmt.Errorf("pgfence: see topic %s/%s: the topic's record kept changing", group, topic)
}

// ResetTopic implements [fence.Topics.ResetTopic] in one transaction. For a recreated topic
// it locks the topic's fences (waiting for their writers), then upserts the fence of every
// partition below the larger partition count and moves every other fence of the topic, each
// with a recovery row: a first claim racing the reset conflicts with the upsert and is judged
// after it.
func (s *Store) ResetTopic(ctx context.Context, group, topic string, expected, to fence.Topic, reason string) error {
	if err := fencecheck.ValidateReset(group, topic, expected, to, reason); err != nil {
		return err
	}
	if err := validText("reason", reason); err != nil {
		return err
	}
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pgfence: reset topic %s/%s: %w", group, topic, err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := s.resetTopic(ctx, tx, group, topic, expected, to, reason); err != nil {
		return fmt.Errorf("pgfence: reset topic %s/%s: %w", group, topic, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgfence: reset topic %s/%s: commit: %w", group, topic, err)
	}
	return nil
}

func (s *Store) resetTopic(ctx context.Context, tx pgx.Tx, group, topic string, expected, to fence.Topic, reason string) error {
	cur, seq, found, err := s.loadTopic(ctx, tx, group, topic)
	if err != nil {
		return err
	}
	recreated, err := fencecheck.CheckTopicReset(group, topic, cur, found, expected, to)
	if err != nil {
		return err
	}
	tag, err := tx.Exec(ctx, s.sqlTopicInsert, group, topic, seq+1, to.ID, to.Partitions, reason)
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("%w: the topic's identity changed meanwhile", fence.ErrConflict)
	}
	if !recreated {
		return nil
	}
	rows, err := tx.Query(ctx, s.sqlTopicLock, group, topic)
	if err != nil {
		return err
	}
	from := map[int32]fence.Token{}
	var p int32
	var t fence.Token
	if _, err := pgx.ForEachRow(rows, []any{&p, &t.Era, &t.Epoch}, func() error { from[p] = t; return nil }); err != nil {
		return err
	}
	for p := range max(cur.Partitions, to.Partitions) {
		if _, ok := from[p]; !ok {
			from[p] = fence.Token{}
		}
	}
	for p, f := range from {
		next := fencecheck.ResetToken(f)
		if err := tx.QueryRow(ctx, s.sqlTopicReset, group, topic, p, next.Era, int64(fencecheck.SealedEpoch)).Scan(&next.Era, &next.Epoch); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.sqlRecoveryInsert, group, topic, p, f.Era, f.Epoch, next.Era, next.Epoch, reason); err != nil {
			return err
		}
	}
	return nil
}

// TopicHistory implements [fence.Topics.TopicHistory].
func (s *Store) TopicHistory(ctx context.Context, group, topic string) ([]fence.TopicRecord, error) {
	if err := fencecheck.ValidateKey(fence.Key{Group: group, Topic: topic}); err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, s.sqlTopicHistory, group, topic)
	if err != nil {
		return nil, fmt.Errorf("pgfence: topic history %s/%s: %w", group, topic, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (fence.TopicRecord, error) {
		r := fence.TopicRecord{Group: group, Topic: topic}
		err := row.Scan(&r.Seq, &r.Identity.ID, &r.Identity.Partitions, &r.Reason, &r.At)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("pgfence: topic history %s/%s: %w", group, topic, err)
	}
	return out, nil
}

// notMigrated names the fix when the topics table is missing (a deployment upgraded without
// running its migration: the consumer retries, and its WARN says what to do).
func notMigrated(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" { // undefined_table
		return fmt.Errorf("%w (the topics table is missing: run 'baton migrate' or Store.Migrate with the migration role)", err)
	}
	return err
}
