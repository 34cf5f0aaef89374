package redisfence

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/fencecheck"
)

// topicAttempts bounds the reads and compare-and-sets of SeeTopic and ResetTopic when other
// writers of the same topic keep moving it.
const topicAttempts = 20

// SeeTopic implements [fence.Topics.SeeTopic]: it reads the stored identity, decides with
// fencecheck.CheckTopic, and stores an adopted identity by a compare-and-set on the record
// sequence (read again and decided again if another writer got there first).
func (s *Store) SeeTopic(ctx context.Context, group, topic string, seen fence.Topic, reason string) (fence.Topic, bool, error) {
	if err := fencecheck.ValidateTopic(group, topic, seen); err != nil {
		return fence.Topic{}, false, err
	}
	if reason == "" {
		return fence.Topic{}, false, fmt.Errorf("%w: adopting a topic needs a reason", fence.ErrInvalid)
	}
	if err := s.ready(ctx); err != nil {
		return fence.Topic{}, false, err
	}
	for range topicAttempts {
		cur, seq, found, err := s.loadTopic(ctx, group, topic)
		if err != nil {
			return fence.Topic{}, false, err
		}
		// The key only names the topic here; the partition rule does not apply to an adoption.
		adopt, _ := fencecheck.CheckTopic(fence.Key{Group: group, Topic: topic}, cur, found, seen)
		if adopt == nil {
			return cur, false, nil
		}
		r, err := s.run(ctx, topicScript, []string{s.k.identity(group, topic), s.k.history(group, topic), s.k.partitions(group, topic)},
			i64(seq), i64(seq+1), adopt.ID, i64(int64(adopt.Partitions)), reason, "0")
		if err != nil {
			return fence.Topic{}, false, fmt.Errorf("redisfence: see topic %s/%s: %w", group, topic, err)
		}
		if r[0] == "ok" {
			return *adopt, true, nil
		}
	}
	return fence.Topic{}, false, fmt.Errorf("redisfence: see topic %s/%s: still moving after %d attempts", group, topic, topicAttempts)
}

func (s *Store) loadTopic(ctx context.Context, group, topic string) (t fence.Topic, seq int64, found bool, err error) {
	v, err := s.c.HMGet(ctx, s.k.identity(group, topic), "seq", "id", "partitions").Result()
	if err != nil {
		return fence.Topic{}, 0, false, fmt.Errorf("redisfence: topic %s/%s: %w", group, topic, err)
	}
	sq, ok := v[0].(string)
	if !ok {
		return fence.Topic{}, 0, false, nil
	}
	t.ID, _ = v[1].(string)
	ps, _ := v[2].(string)
	seq, err1 := strconv.ParseInt(sq, 10, 64)
	p, err2 := strconv.ParseInt(ps, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return fence.Topic{}, 0, false, fmt.Errorf("redisfence: topic %s/%s: %w", group, topic, err)
	}
	t.Partitions = int32(p)
	return t, seq, true, nil
}

// ResetTopic implements [fence.Topics.ResetTopic] in one script: the identity's
// compare-and-set and, for a recreated topic, every fence of the topic (those that exist and
// every partition below the larger partition count) moved to fencecheck.ResetToken with no
// claimant and no position, each recorded as a recovery. It waits while a transaction holds
// one of the fences.
func (s *Store) ResetTopic(ctx context.Context, group, topic string, expected, to fence.Topic, reason string) error {
	if err := fencecheck.ValidateReset(group, topic, expected, to, reason); err != nil {
		return err
	}
	if err := s.ready(ctx); err != nil {
		return err
	}
	for range topicAttempts {
		cur, seq, found, err := s.loadTopic(ctx, group, topic)
		if err != nil {
			return err
		}
		recreated, err := fencecheck.CheckTopicReset(group, topic, cur, found, expected, to)
		if err != nil {
			return err
		}
		pk := s.k.partitions(group, topic)
		keys := []string{s.k.identity(group, topic), s.k.history(group, topic), pk}
		var parts []any
		if recreated {
			members, err := s.c.SMembers(ctx, pk).Result()
			if err != nil {
				return fmt.Errorf("redisfence: reset topic %s/%s: %w", group, topic, err)
			}
			var ps []int32
			for p := range max(cur.Partitions, to.Partitions) {
				ps = append(ps, p)
			}
			for _, m := range members {
				p, err := strconv.ParseInt(m, 10, 32)
				if err != nil {
					return fmt.Errorf("redisfence: reset topic %s/%s: partition %q: %w", group, topic, m, err)
				}
				ps = append(ps, int32(p))
			}
			slices.Sort(ps)
			for _, p := range slices.Compact(ps) {
				k := fence.Key{Group: group, Topic: topic, Partition: p}
				st, err := s.Load(ctx, k)
				if err != nil {
					return err
				}
				next := fencecheck.ResetToken(st.Token)
				fk := s.k.fence(k)
				keys = append(keys, fk, hold(fk), s.k.recovery(k))
				parts = append(parts, i64(int64(p)), i64(st.Token.Era), i64(st.Token.Epoch), i64(next.Era))
			}
		}
		args := append([]any{i64(seq), i64(seq + 1), to.ID, i64(int64(to.Partitions)), reason, strconv.Itoa(len(parts) / 4)}, parts...)
		r, err := s.run(ctx, topicScript, keys, args...)
		if err != nil {
			return fmt.Errorf("redisfence: reset topic %s/%s: %w", group, topic, err)
		}
		if r[0] == "ok" {
			return nil
		}
	}
	return fmt.Errorf("redisfence: reset topic %s/%s: still moving after %d attempts", group, topic, topicAttempts)
}

// TopicHistory implements [fence.Topics.TopicHistory]. At is the server's clock, to the
// millisecond.
func (s *Store) TopicHistory(ctx context.Context, group, topic string) ([]fence.TopicRecord, error) {
	if err := fencecheck.ValidateKey(fence.Key{Group: group, Topic: topic}); err != nil {
		return nil, err
	}
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	msgs, err := s.c.XRange(ctx, s.k.history(group, topic), "-", "+").Result()
	if err != nil {
		return nil, fmt.Errorf("redisfence: topic history %s/%s: %w", group, topic, err)
	}
	out := make([]fence.TopicRecord, 0, len(msgs))
	for _, m := range msgs {
		r := fence.TopicRecord{Group: group, Topic: topic, Reason: field(m, "reason"), At: idTime(m.ID)}
		r.Identity.ID = field(m, "id")
		seq, err1 := strconv.ParseInt(field(m, "seq"), 10, 64)
		p, err2 := strconv.ParseInt(field(m, "partitions"), 10, 32)
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("redisfence: topic record %s of %s/%s: %w", m.ID, group, topic, err)
		}
		r.Seq, r.Identity.Partitions = seq, int32(p)
		out = append(out, r)
	}
	return out, nil
}
