package sqlitefence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/fencecheck"
)

var _ fence.Topics = (*Store)(nil)

// SeeTopic implements [fence.Topics.SeeTopic] in one write transaction.
func (s *Store) SeeTopic(ctx context.Context, group, topic string, seen fence.Topic, reason string) (fence.Topic, bool, error) {
	if err := fencecheck.ValidateTopic(group, topic, seen); err != nil {
		return fence.Topic{}, false, err
	}
	if reason == "" {
		return fence.Topic{}, false, fmt.Errorf("%w: adopting a topic needs a reason", fence.ErrInvalid)
	}
	var stored fence.Topic
	var adopted bool
	err := s.writeTx(ctx, func(ctx context.Context, tx *sql.Tx, _ func()) error {
		cur, seq, found, err := s.loadTopic(ctx, tx, group, topic)
		if err != nil {
			return err
		}
		// The key only names the topic here; the partition rule does not apply to an adoption.
		adopt, _ := fencecheck.CheckTopic(fence.Key{Group: group, Topic: topic}, cur, found, seen)
		stored, adopted = cur, adopt != nil
		if adopt == nil {
			return nil
		}
		stored = *adopt
		_, err = tx.ExecContext(ctx, s.q.topicInsert, group, topic, seq+1, adopt.ID, adopt.Partitions, reason, time.Now().UnixNano())
		return err
	})
	if err != nil {
		return fence.Topic{}, false, fmt.Errorf("sqlitefence: see topic %s/%s: %w", group, topic, err)
	}
	return stored, adopted, nil
}

func (s *Store) loadTopic(ctx context.Context, tx *sql.Tx, group, topic string) (t fence.Topic, seq int64, found bool, err error) {
	err = tx.QueryRowContext(ctx, s.q.topicLoad, group, topic).Scan(&seq, &t.ID, &t.Partitions)
	if errors.Is(err, sql.ErrNoRows) {
		return fence.Topic{}, 0, false, nil
	}
	return t, seq, err == nil, err
}

// ResetTopic implements [fence.Topics.ResetTopic] in one write transaction: for a recreated
// topic it upserts the fence of every partition below the larger partition count (and moves
// every other fence row of the topic), so a claim of the old incarnation judged after it is
// refused whether or not its fence existed before.
func (s *Store) ResetTopic(ctx context.Context, group, topic string, expected, to fence.Topic, reason string) error {
	if err := fencecheck.ValidateReset(group, topic, expected, to, reason); err != nil {
		return err
	}
	err := s.writeTx(ctx, func(ctx context.Context, tx *sql.Tx, _ func()) error {
		cur, seq, found, err := s.loadTopic(ctx, tx, group, topic)
		if err != nil {
			return err
		}
		recreated, err := fencecheck.CheckTopicReset(group, topic, cur, found, expected, to)
		if err != nil {
			return err
		}
		now := time.Now().UnixNano()
		if recreated {
			stored := map[int32]fence.Token{}
			rows, err := tx.QueryContext(ctx, s.q.topicPartitions, group, topic)
			if err != nil {
				return err
			}
			for rows.Next() {
				var p int32
				var t fence.Token
				if err := rows.Scan(&p, &t.Era, &t.Epoch); err != nil {
					rows.Close()
					return err
				}
				stored[p] = t
			}
			if err := errors.Join(rows.Err(), rows.Close()); err != nil {
				return err
			}
			for p := range max(cur.Partitions, to.Partitions) {
				if _, ok := stored[p]; !ok {
					stored[p] = fence.Token{}
				}
			}
			for p, from := range stored {
				next := fencecheck.ResetToken(from)
				if _, err := tx.ExecContext(ctx, s.q.topicReset, group, topic, p, next.Era, int64(fencecheck.SealedEpoch)); err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx, s.q.recoveryInsert, group, topic, p,
					from.Era, from.Epoch, next.Era, next.Epoch, reason, now); err != nil {
					return err
				}
			}
		}
		_, err = tx.ExecContext(ctx, s.q.topicInsert, group, topic, seq+1, to.ID, to.Partitions, reason, now)
		return err
	})
	if err != nil {
		return fmt.Errorf("sqlitefence: reset topic %s/%s: %w", group, topic, err)
	}
	return nil
}

// TopicHistory implements [fence.Topics.TopicHistory].
func (s *Store) TopicHistory(ctx context.Context, group, topic string) ([]fence.TopicRecord, error) {
	if err := fencecheck.ValidateKey(fence.Key{Group: group, Topic: topic}); err != nil {
		return nil, err
	}
	rows, err := s.db.QueryContext(ctx, s.q.topicHistory, group, topic)
	if err != nil {
		return nil, wrapBusy(err)
	}
	defer rows.Close()
	var out []fence.TopicRecord
	for rows.Next() {
		r := fence.TopicRecord{Group: group, Topic: topic}
		var at int64
		if err := rows.Scan(&r.Seq, &r.Identity.ID, &r.Identity.Partitions, &r.Reason, &at); err != nil {
			return nil, err
		}
		r.At = time.Unix(0, at)
		out = append(out, r)
	}
	return out, wrapBusy(rows.Err())
}
