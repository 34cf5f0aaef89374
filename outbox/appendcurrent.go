package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/batonhq/baton/fence"
)

// appendAttempts bounds how many times [AppendCurrent] loads a shard's token and appends: one
// attempt, plus a retry after each claim that landed between the load and the append.
const appendAttempts = 5

// Appender is the Append method of an outbox store (pgoutbox.Store for pgx.Tx,
// sqliteoutbox.Store for *sql.Tx).
type Appender[Tx any] interface {
	Append(ctx context.Context, tx Tx, src fence.Key, tok fence.Token, msgs ...Message) error
}

// AppendCurrent appends msgs to shard src (outboxconsumer.ShardKey) of a standalone relay
// inside the caller's transaction tx, stamped with the token the shard's fence stores now: the appending
// application is not the shard's owner and has no token of its own. It returns that token.
//
// It loads the token with sink.Load, then calls box.Append, which checks in the same statement
// that the fence still stores exactly that token and holds it until tx ends (PostgreSQL: a
// share lock on the fence row; SQLite: the write lock tx took at BEGIN IMMEDIATE), so no claim
// commits between the append and the caller's commit. If a relay claimed the shard between the
// load and the append, Append refuses with a *fence.StaleError and writes nothing; the token is
// loaded again and the append retried, at most 5 times in all. The refusal is a
// clean result in both stores, so tx stays usable for the retry.
//
// Rows keep per-shard sequence order with non-decreasing tokens: once a claim committed, no
// append under an older token can. Choose the shard from the entity the messages are about
// (e.g. a hash of its key modulo the shard count) so that one entity's messages share one
// shard's sequence: receivers order and deduplicate per (source shard, record key).
//
// A shard whose fence was never claimed (no outboxconsumer.PrepareShards, no relay yet) has no
// fence row and refuses appends with [ErrUnfenced]. PostgreSQL transactions must run at READ COMMITTED
// (the default) for the retry to see the new token; at REPEATABLE READ a concurrent claim
// surfaces as a serialization error of tx instead. On any error roll tx back.
func AppendCurrent[Tx any](ctx context.Context, tx Tx, sink fence.Sink[Tx], box Appender[Tx], src fence.Key, msgs ...Message) (fence.Token, error) {
	if sink == nil || box == nil {
		return fence.Token{}, fmt.Errorf("%w: nil sink or store", ErrInvalid)
	}
	var err error
	for range appendAttempts {
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
				return fence.Token{}, fmt.Errorf("%w (prepare the shards with outboxconsumer.PrepareShards, or start the relay first)", err)
			}
			return fence.Token{}, err
		}
	}
	return fence.Token{}, fmt.Errorf("outbox: append to %s: the shard was claimed %d times during the append: %w", src, appendAttempts, err)
}
