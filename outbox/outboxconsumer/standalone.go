package outboxconsumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/fencecheck"
	"github.com/batonhq/baton/outbox"
)

// ShardKey is the source key an application appends under for a shard of a standalone relay:
// the fence key that the member owning that partition of coordTopic in group claims and relays
// under.
func ShardKey(group, coordTopic string, shard int32) fence.Key {
	return fence.Key{Group: group, Topic: coordTopic, Partition: shard}
}

// NewStandaloneRelay returns a Baton consumer that relays, for each shard of coordTopic this
// member owns, the outbox rows appended under [ShardKey](group, coordTopic, shard) (with
// [outbox.AppendCurrent]). coordTopic
// is a coordination topic the operator creates with one partition per shard; nothing is ever
// produced to it. The group coordinator hands each of its partitions to one member; that member
// claims the shard's fence in sink with its token and runs relay.Flush for the shard on
// assignment and every interval, under that token. A takeover (a member leaves, dies or is
// paused past its session) claims a higher token, so the old member can no longer mark or skip
// rows, exactly as for a consumer's own outbox.
//
// opts are the consumer's options (consumer.Kafka with the seed brokers is required). The relay
// hook is installed last, so an AfterCommit among opts is replaced. Records produced to
// coordTopic by mistake are applied as no-ops (they only advance the shard fence's position).
// Run the returned consumer like any other; it stops relaying a shard the moment the shard is
// revoked or lost. Keep consumer.RecoverRegressions on (the default): the coordination group
// commits no offsets, so Kafka deletes it after a long full stop and its generation restarts
// at 1, below the tokens the shards store; the first member then recovers each shard into a
// new era instead of leaving it unrelayed.
func NewStandaloneRelay[Tx any](group, coordTopic string, sink fence.Sink[Tx], relay *outbox.Relay, interval time.Duration, opts ...consumer.Option) (*consumer.Consumer[Tx], error) {
	if relay == nil {
		return nil, fmt.Errorf("%w: nil relay", outbox.ErrInvalid)
	}
	if err := fencecheck.ValidateKey(ShardKey(group, coordTopic, 0)); err != nil {
		return nil, fmt.Errorf("%w: %w", outbox.ErrInvalid, err)
	}
	noop := func(context.Context, Tx, *consumer.Batch) error { return nil }
	all := append(opts[:len(opts):len(opts)], consumer.AfterCommit(relay.AfterCommit(), interval))
	return consumer.New(group, []string{coordTopic}, sink, noop, all...)
}

// PrepareShards makes shards 0..shards-1 of a standalone relay accept appends before any relay
// has claimed them: it claims each shard's fence with the zero token, which every real owner's
// token outranks, unless a relay already claimed it (a *fence.StaleError, ignored). Rows
// appended under the zero token are relayed by the first owner like any others. Call it once at
// startup, outside any transaction: each claim is a write transaction of its own (in SQLite it
// would wait for the write lock a caller's open transaction holds). It is idempotent.
//
// shards is the shard count the application chooses shards with (entity hash modulo shards),
// which must be coordTopic's partition count. If sink stores topic identities (fence.Topics:
// memfence, pgfence, sqlitefence), the count is checked against the one acknowledged for
// (group, coordTopic), the same record the relay's claims compare coordTopic with; the first
// call (or the relay's first claim) records it. Changing the count moves entities between
// shards, so a count above the acknowledged one is refused with a *fence.TopicError
// ([fence.ErrTopicGrown]) until an operator has drained every shard, grown coordTopic and
// acknowledged it (baton topics ack); a count below it is refused with [outbox.ErrInvalid]
// (shards are never removed). See "Changing the standalone relay's shard count" in DESIGN.md.
func PrepareShards[Tx any](ctx context.Context, sink fence.Sink[Tx], group, coordTopic string, shards int32) error {
	if sink == nil {
		return fmt.Errorf("%w: nil sink", outbox.ErrInvalid)
	}
	if shards < 1 {
		return fmt.Errorf("%w: %d shards", outbox.ErrInvalid, shards)
	}
	if err := fencecheck.ValidateKey(ShardKey(group, coordTopic, shards-1)); err != nil {
		return fmt.Errorf("%w: %w", outbox.ErrInvalid, err)
	}
	if err := checkShardCount(ctx, sink, group, coordTopic, shards); err != nil {
		return err
	}
	for i := range shards {
		k := ShardKey(group, coordTopic, i)
		if _, err := sink.Claim(ctx, k, fence.Token{}, "outboxconsumer.PrepareShards"); err != nil && !errors.Is(err, fence.ErrStale) {
			return fmt.Errorf("outboxconsumer: preparing shard %s: %w", k, err)
		}
	}
	return nil
}

// checkShardCount compares shards with the partition count acknowledged for (group,
// coordTopic), recording it if none is.
func checkShardCount[Tx any](ctx context.Context, sink fence.Sink[Tx], group, coordTopic string, shards int32) error {
	ts, ok := sink.(fence.Topics)
	if !ok {
		return nil
	}
	stored, _, err := ts.SeeTopic(ctx, group, coordTopic, fence.Topic{Partitions: shards},
		fmt.Sprintf("adopted by outboxconsumer.PrepareShards: the application's shard count %d", shards))
	if err != nil {
		return fmt.Errorf("outboxconsumer: the shard count of %s/%s: %w", group, coordTopic, err)
	}
	switch {
	case stored.Partitions == shards:
		return nil
	case shards > stored.Partitions:
		return fmt.Errorf("outboxconsumer: %d shards, %d acknowledged: entities would move between shards; stop the appenders, wait until every shard's outbox backlog is 0, grow %s to %d partitions, acknowledge it (baton topics ack), then prepare %d: %w",
			shards, stored.Partitions, coordTopic, shards, shards,
			&fence.TopicError{Key: ShardKey(group, coordTopic, stored.Partitions), Stored: stored, Seen: fence.Topic{ID: stored.ID, Partitions: shards}})
	}
	return fmt.Errorf("%w: %d shards, but %d are acknowledged for %s/%s: shards are never removed (entities would move between shards); prepare %d",
		outbox.ErrInvalid, shards, stored.Partitions, group, coordTopic, stored.Partitions)
}
