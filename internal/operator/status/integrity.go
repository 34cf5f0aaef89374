package status

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/sqlident"
)

// The readers below serve an auditor judging Baton's records (internal/operator/audit): each is
// one statement (plus the table's existence check), bounded by its arguments, and reads only.

// KafkaState is what the brokers say about a group: its state, its members, each partition's
// owning member, Kafka's committed offset, high watermark and log start offset, and the topic ID
// of each topic whose offsets were listed.
type KafkaState struct {
	State         string
	Members       []Member
	Owner         map[fence.Key]*Member
	Committed     map[fence.Key]int64
	HighWatermark map[fence.Key]int64
	LogStart      map[fence.Key]int64
	// TopicID is each topic's ID (KIP-516, Kafka's text form), read after its offsets: a
	// topic recreated while they were listed shows its new ID. Absent or "": unknown (a
	// broker without topic IDs, or a topic gone meanwhile).
	TopicID map[string]string
}

// Kafka reads the group's state from the brokers: the group's members and committed offsets,
// then the end and start offsets of the configured topics, or of the topics the group commits
// to and extraTopics, then those topics' IDs (one metadata request more when there are
// topics). It fails with an error wrapping [ErrUnreachable].
func (c *Collector) Kafka(ctx context.Context, extraTopics []string) (*KafkaState, error) {
	v, err := c.readKafka(ctx, extraTopics)
	if err != nil {
		return nil, err
	}
	ids, err := c.topicIDs(ctx, slices.Sorted(maps.Keys(v.topics)))
	if err != nil {
		return nil, err
	}
	return &KafkaState{State: v.state, Members: v.members, Owner: maps.Clone(v.owner), Committed: v.committed, HighWatermark: v.hwm, LogStart: v.start, TopicID: ids}, nil
}

// topicIDs reads the IDs of topics from the brokers (brokerTopics: not the client's cached
// metadata, which may be older than the offsets read before).
func (c *Collector) topicIDs(ctx context.Context, names []string) (map[string]string, error) {
	topics, err := c.brokerTopics(ctx, names)
	if err != nil {
		return nil, err
	}
	ids := map[string]string{}
	for n, t := range topics {
		if t.ID != "" {
			ids[n] = t.ID
		}
	}
	return ids, nil
}

// TopicIDs returns, for each of topics, the topic ID stored with the group's fences (the
// incarnation whose offsets their positions are, fence.Topics): a topic with no identity
// stored, or one stored without an ID, is absent, as is every topic of a store without the
// topics table. It reads one statement per topic, plus the table's existence check.
func (s *Store) TopicIDs(ctx context.Context, group string, topics []string) (map[string]string, error) {
	out := map[string]string{}
	if len(topics) == 0 {
		return out, nil
	}
	if ok, err := s.tableExists(ctx, s.tables.Fence+"_topics"); err != nil || !ok {
		return out, err
	}
	ts, err := s.topics()
	if err != nil {
		return nil, err
	}
	for _, t := range topics {
		s.queries.Add(1)
		h, err := ts.TopicHistory(ctx, group, t)
		if err != nil {
			return nil, fmt.Errorf("reading the identity of %s/%s from %s: %w", group, t, s.Describe(), err)
		}
		if len(h) > 0 && h[len(h)-1].Identity.ID != "" {
			out[t] = h[len(h)-1].Identity.ID
		}
	}
	return out, nil
}

// OutboxCursor is one source partition's outbox cursor with a summary of its pending rows (those
// above the delivered sequence).
type OutboxCursor struct {
	Topic     string
	Partition int32
	LastSeq   int64 // the last sequence allocated
	Delivered int64 // every row at or below it was acknowledged by the broker (or dead-lettered)
	Pending   int64 // rows present above Delivered
	MinSeq    int64 // the lowest and highest of them (0 without pending rows)
	MaxSeq    int64
	Oldest    time.Time // the oldest pending row's creation time (zero without pending rows)
}

// OutboxCursors returns the group's outbox cursors, each with its pending rows counted, in one
// statement. A store without the outbox's tables returns nil, nil.
func (s *Store) OutboxCursors(ctx context.Context, group string) ([]OutboxCursor, error) {
	cursors := s.tables.Outbox + "_cursors"
	for _, t := range []string{s.tables.Outbox, cursors} {
		if ok, err := s.tableExists(ctx, t); err != nil || !ok {
			return nil, err
		}
	}
	grp, created := "group_id", "min(o.created_at)"
	if s.dialect == SQLite {
		grp, created = "grp", "min(o.created_ns)"
	}
	q := fmt.Sprintf(`SELECT c.topic, c.partition, c.last_seq, c.delivered_seq, count(o.seq), coalesce(min(o.seq), 0), coalesce(max(o.seq), 0), %[5]s
FROM %[1]s c LEFT JOIN %[2]s o ON o.%[3]s = c.%[3]s AND o.topic = c.topic AND o.partition = c.partition AND o.seq > c.delivered_seq
WHERE c.%[3]s = %[4]s
GROUP BY c.topic, c.partition, c.last_seq, c.delivered_seq
ORDER BY c.topic, c.partition`, sqlident.Quote(cursors), sqlident.Quote(s.tables.Outbox), grp, s.param(1), created)
	var out []OutboxCursor
	err := s.rows(ctx, q, func(scan func(...any) error) error {
		var c OutboxCursor
		var pgAt *time.Time
		var ns *int64
		var at any = &pgAt
		if s.dialect == SQLite {
			at = &ns
		}
		if err := scan(&c.Topic, &c.Partition, &c.LastSeq, &c.Delivered, &c.Pending, &c.MinSeq, &c.MaxSeq, at); err != nil {
			return err
		}
		switch {
		case pgAt != nil:
			c.Oldest = pgAt.UTC()
		case ns != nil:
			c.Oldest = time.Unix(0, *ns).UTC()
		}
		out = append(out, c)
		return nil
	}, group)
	if err != nil {
		return nil, fmt.Errorf("reading the outbox cursors of group %q from %s: %w", group, s.Describe(), err)
	}
	return out, nil
}

// OutboxSeqs returns up to limit sequences of k's outbox rows above after, in order.
func (s *Store) OutboxSeqs(ctx context.Context, k fence.Key, after int64, limit int) ([]int64, error) {
	grp := "group_id"
	if s.dialect == SQLite {
		grp = "grp"
	}
	q := fmt.Sprintf(`SELECT seq FROM %s WHERE %s = %s AND topic = %s AND partition = %s AND seq > %s ORDER BY seq LIMIT %d`,
		sqlident.Quote(s.tables.Outbox), grp, s.param(1), s.param(2), s.param(3), s.param(4), limit)
	var out []int64
	err := s.rows(ctx, q, func(scan func(...any) error) error {
		var n int64
		if err := scan(&n); err != nil {
			return err
		}
		out = append(out, n)
		return nil
	}, k.Group, k.Topic, k.Partition, after)
	if err != nil {
		return nil, fmt.Errorf("reading the outbox sequences of %s from %s: %w", k, s.Describe(), err)
	}
	return out, nil
}

// DeadLettered returns the sequences of the group's dead-lettered outbox rows above after, per
// source partition. A store without the dead-letter table returns nil, nil.
func (s *Store) DeadLettered(ctx context.Context, group string, after int64) (map[fence.Key][]int64, error) {
	table := s.tables.Outbox + "_dead_letters"
	if ok, err := s.tableExists(ctx, table); err != nil || !ok {
		return nil, err
	}
	grp := "group_id"
	if s.dialect == SQLite {
		grp = "grp"
	}
	q := fmt.Sprintf(`SELECT topic, partition, seq FROM %s WHERE %s = %s AND seq > %s ORDER BY topic, partition, seq`,
		sqlident.Quote(table), grp, s.param(1), s.param(2))
	out := map[fence.Key][]int64{}
	err := s.rows(ctx, q, func(scan func(...any) error) error {
		k := fence.Key{Group: group}
		var n int64
		if err := scan(&k.Topic, &k.Partition, &n); err != nil {
			return err
		}
		out[k] = append(out[k], n)
		return nil
	}, group, after)
	if err != nil {
		return nil, fmt.Errorf("reading the dead-lettered outbox rows of group %q from %s: %w", group, s.Describe(), err)
	}
	return out, nil
}

// Admission is one inbox admission: the highest (token, sequence) admitted for an entity of a
// scope (fence.KeyedSink).
type Admission struct {
	Scope, ID string
	Token     fence.Token
	Seq       int64
}

// Admissions returns up to limit admissions of the keyed table in (scope, id) order, starting
// after (afterScope, afterID) (both "" for the first page). A store without the keyed table
// returns nil, nil.
func (s *Store) Admissions(ctx context.Context, afterScope, afterID string, limit int) ([]Admission, error) {
	table := s.tables.Fence + "_keyed"
	if ok, err := s.tableExists(ctx, table); err != nil || !ok {
		return nil, err
	}
	q := fmt.Sprintf(`SELECT scope, id, era, epoch, seq FROM %s WHERE (scope, id) > (%s, %s) ORDER BY scope, id LIMIT %d`,
		sqlident.Quote(table), s.param(1), s.param(2), limit)
	var out []Admission
	err := s.rows(ctx, q, func(scan func(...any) error) error {
		var a Admission
		if err := scan(&a.Scope, &a.ID, &a.Token.Era, &a.Token.Epoch, &a.Seq); err != nil {
			return err
		}
		out = append(out, a)
		return nil
	}, afterScope, afterID)
	if err != nil {
		return nil, fmt.Errorf("reading the inbox admissions of %s from %s: %w", table, s.Describe(), err)
	}
	return out, nil
}
