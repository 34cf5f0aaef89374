package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
)

// AppendAttempts bounds how many times [AppendCurrent] loads a shard's token and appends: one
// attempt, plus a retry after each claim that landed between the load and the append.
const AppendAttempts = 5

// ShardKey is the source key an application appends under for shard i of a standalone relay:
// the fence key that the member owning partition i of coordTopic in group claims and relays
// under.
func ShardKey(group, coordTopic string, shard int32) fence.Key {
	return fence.Key{Group: group, Topic: coordTopic, Partition: shard}
}

// NewStandaloneRelay returns a Baton consumer that relays, for each shard of coordTopic this
// member owns, the outbox rows appended under [ShardKey](group, coordTopic, shard). coordTopic
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
func NewStandaloneRelay[Tx any](group, coordTopic string, sink fence.Sink[Tx], relay *Relay, interval time.Duration, opts ...consumer.Option) (*consumer.Consumer[Tx], error) {
	if relay == nil {
		return nil, fmt.Errorf("%w: nil relay", ErrInvalid)
	}
	if err := ShardKey(group, coordTopic, 0).Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	noop := consumer.HandlerFunc[Tx](func(context.Context, Tx, *consumer.Batch) error { return nil })
	factory := func(context.Context, fence.Key, fence.Token) (consumer.Handler[Tx], error) { return noop, nil }
	all := append(opts[:len(opts):len(opts)], consumer.AfterCommit(relay.AfterCommit(), interval))
	return consumer.New(group, []string{coordTopic}, sink, factory, all...)
}

// PrepareShards makes shards 0..shards-1 of a standalone relay accept appends before any relay
// has claimed them: it claims each shard's fence with the zero token, which every real owner's
// token outranks, unless a relay already claimed it (a *fence.StaleError, ignored). Rows
// appended under the zero token are relayed by the first owner like any others. Call it once at
// startup, outside any transaction: each claim is a write transaction of its own (in SQLite it
// would wait for the write lock a caller's open transaction holds). It is idempotent.
func PrepareShards[Tx any](ctx context.Context, sink fence.Sink[Tx], group, coordTopic string, shards int32) error {
	if sink == nil {
		return fmt.Errorf("%w: nil sink", ErrInvalid)
	}
	if shards < 1 {
		return fmt.Errorf("%w: %d shards", ErrInvalid, shards)
	}
	for i := range shards {
		k := ShardKey(group, coordTopic, i)
		if _, err := sink.Claim(ctx, k, fence.Token{}); err != nil && !errors.Is(err, fence.ErrStale) {
			return fmt.Errorf("outbox: preparing shard %s: %w", k, err)
		}
	}
	return nil
}

// Appender is the Append method of an outbox store (pgoutbox.Store for pgx.Tx,
// sqliteoutbox.Store for *sql.Tx).
type Appender[Tx any] interface {
	Append(ctx context.Context, tx Tx, src fence.Key, tok fence.Token, msgs ...Message) error
}

// AppendCurrent appends msgs to shard src (a [ShardKey]) of a standalone relay inside the
// caller's transaction tx, stamped with the token the shard's fence stores now: the appending
// application is not the shard's owner and has no token of its own. It returns that token.
//
// It loads the token with sink.Load, then calls box.Append, which checks in the same statement
// that the fence still stores exactly that token and holds it until tx ends (PostgreSQL: a
// share lock on the fence row; SQLite: the write lock tx took at BEGIN IMMEDIATE), so no claim
// commits between the append and the caller's commit. If a relay claimed the shard between the
// load and the append, Append refuses with a *fence.StaleError and writes nothing; the token is
// loaded again and the append retried, at most [AppendAttempts] times in all. The refusal is a
// clean result in both stores, so tx stays usable for the retry.
//
// Rows keep per-shard sequence order with non-decreasing tokens: once a claim committed, no
// append under an older token can. Choose the shard from the entity the messages are about
// (e.g. a hash of its key modulo the shard count) so that one entity's messages share one
// shard's sequence: receivers order and deduplicate per (source shard, record key).
//
// A shard whose fence was never claimed (no [PrepareShards], no relay yet) has no fence row
// and refuses appends with [ErrUnfenced]. PostgreSQL transactions must run at READ COMMITTED
// (the default) for the retry to see the new token; at REPEATABLE READ a concurrent claim
// surfaces as a serialization error of tx instead. On any error roll tx back.
func AppendCurrent[Tx any](ctx context.Context, tx Tx, sink fence.Sink[Tx], box Appender[Tx], src fence.Key, msgs ...Message) (fence.Token, error) {
	if sink == nil || box == nil {
		return fence.Token{}, fmt.Errorf("%w: nil sink or store", ErrInvalid)
	}
	var err error
	for range AppendAttempts {
		var st fence.State
		st, err = sink.Load(ctx, src)
		if err != nil {
			return fence.Token{}, fmt.Errorf("outbox: loading the token of %s: %w", src, err)
		}
		err = box.Append(ctx, tx, src, st.Token, msgs...)
		if err == nil {
			return st.Token, nil
		}
		if !errors.Is(err, fence.ErrStale) {
			if errors.Is(err, ErrUnfenced) && st.Token.IsZero() {
				return fence.Token{}, fmt.Errorf("%w (prepare the shards with PrepareShards, or start the relay first)", err)
			}
			return fence.Token{}, err
		}
	}
	return fence.Token{}, fmt.Errorf("outbox: append to %s: the shard was claimed %d times during the append: %w", src, AppendAttempts, err)
}
