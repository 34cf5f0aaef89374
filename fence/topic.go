package fence

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Topic is what a sink stores about one source topic for one consumer group, next to its
// fences: which incarnation of the topic the fences' positions belong to, and how many
// partitions the group has acknowledged.
type Topic struct {
	// ID is the Kafka topic ID (KIP-516) of the incarnation whose offsets the fences hold, in
	// Kafka's text form (URL-safe base64 without padding). A topic deleted and recreated under
	// the same name gets a new ID; "" means unknown (a broker without topic IDs).
	ID string
	// Partitions is the partition count the group has acknowledged. A topic with more was
	// grown: keys moved between its partitions.
	Partitions int32
}

func (t Topic) String() string {
	id := t.ID
	if id == "" {
		id = "(no id)"
	}
	return fmt.Sprintf("%s with %d partitions", id, t.Partitions)
}

// TopicRecord is one recorded identity of a topic: adopted by the first claim that saw it, or
// set by an operator's [Topics.ResetTopic] (a recreated topic accepted, partition growth
// acknowledged). Seq rises by one per record, from 1.
type TopicRecord struct {
	Group, Topic string
	Seq          int64
	Identity     Topic
	Reason       string
	At           time.Time // the sink's clock; informational only
}

// Topics is implemented by sinks that store each source topic's identity with the fences
// (pgfence, sqlitefence and redisfence do). The consumer checks it after every claim: a
// partition of a topic recreated under the same name, or of partitions added by growing the
// topic, is not processed until an operator resets the stored identity.
type Topics interface {
	// SeeTopic returns the identity stored for (group, topic). If none is stored, or it has
	// no ID and seen has one, seen is stored and recorded with reason (the first claim that
	// sees a topic adopts it: fences written before topic identities were stored adopt the
	// incarnation present at the upgrade) and adopted is true. It never changes a stored ID
	// or partition count: only ResetTopic does.
	SeeTopic(ctx context.Context, group, topic string, seen Topic, reason string) (stored Topic, adopted bool, err error)
	// ResetTopic replaces the stored identity, if it is still expected, with to, and records
	// reason (required); otherwise it fails with ErrConflict. If the ID changes (a recreated
	// topic accepted), every fence of (group, topic) moves, in the same transaction, to a new
	// era with no claimant and no position, each recorded as a [Recovery] with reason: the
	// new incarnation is read from its beginning, and no token of the old one is accepted
	// again. A sealed fence, one whose token's epoch is math.MaxInt64 (no claim in its era
	// reaches it: the shard router's retired fences), stays sealed: it moves to the new era
	// with epoch math.MaxInt64 and keeps its claimant, in the same transaction, so a reset
	// never makes it claimable. If only Partitions rises (growth acknowledged), no fence
	// changes. Partitions may not shrink.
	ResetTopic(ctx context.Context, group, topic string, expected, to Topic, reason string) error
	// TopicHistory lists the recorded identities of (group, topic), oldest first.
	TopicHistory(ctx context.Context, group, topic string) ([]TopicRecord, error)
}

var (
	// ErrTopicRecreated means the topic a claim reads has another ID than the one stored with
	// the fences: it was deleted and recreated under the same name (or the group now reads
	// another cluster). The fences' positions belong to the old incarnation, so resuming from
	// them would skip the new one's records. Errors returned for it are *TopicError.
	ErrTopicRecreated = errors.New("fence: topic recreated")
	// ErrTopicGrown means the topic has more partitions than the count acknowledged for it:
	// it was grown, which moves keys between its partitions (to the new ones and among the
	// old ones), and a partition's backlog may still hold earlier records of a key that now
	// goes elsewhere. Errors returned for it are *TopicError.
	ErrTopicGrown = errors.New("fence: topic grown")
)

// TopicError reports a topic whose identity differs from the one stored with its fences.
type TopicError struct {
	Key    Key   // the partition refused
	Stored Topic // what the sink stores
	Seen   Topic // what the claimant sees
}

func (e *TopicError) Error() string {
	if e.recreated() {
		return fmt.Sprintf("fence: topic %s was recreated: the fences hold topic id %s, the broker has %s; an operator must reset it (baton topics reset)",
			e.Key, e.Stored.ID, e.Seen.ID)
	}
	return fmt.Sprintf("fence: topic %s was grown from %d to %d partitions: held until an operator acknowledges the growth (baton topics ack)",
		e.Key, e.Stored.Partitions, e.Seen.Partitions)
}

func (e *TopicError) recreated() bool {
	return e.Stored.ID != "" && e.Seen.ID != "" && e.Stored.ID != e.Seen.ID
}

// Unwrap returns [ErrTopicRecreated] or [ErrTopicGrown].
func (e *TopicError) Unwrap() error {
	if e.recreated() {
		return ErrTopicRecreated
	}
	return ErrTopicGrown
}
