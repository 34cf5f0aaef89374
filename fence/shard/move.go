package shard

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"

	"github.com/batonhq/baton/fence"
)

func seededBy(version int64) string { return seededPrefix + strconv.FormatInt(version, 10) }

// Move runs the steps of a move in order; each one first looks at what a previous, interrupted
// run left and does only what is missing.
func (r *router[Tx]) Move(ctx context.Context, k fence.Key, to string, copy func(ctx context.Context, k fence.Key, from string, tx Tx) error) error {
	dst, ok := r.shards[to]
	if !ok {
		return fmt.Errorf("%w: shard: moving %s to shard %q, which this router was not given", fence.ErrInvalid, k, to)
	}
	cur, err := r.reload(ctx)
	if err != nil {
		return err
	}
	from := cur.Shard(k)
	if from == to {
		return nil
	}
	if _, ok := r.shards[from]; !ok {
		return fmt.Errorf("%w: shard: %s is placed on shard %q, which this router was not given", fence.ErrInvalid, k, from)
	}
	version := cur.Version + 1
	what := fmt.Sprintf("move %s from shard %s to shard %s (placement %d)", k, from, to, version)

	// 1. The old shard refuses k for ever; the batch in flight there, if any, ends first.
	if err := r.Retire(ctx, k, version, what+": retire on "+from); err != nil {
		return err
	}
	old, err := r.shards[from].Load(ctx, k)
	if err != nil {
		return fmt.Errorf("shard: %s: loading the retired fence: %w", what, err)
	}

	// 2. The new shard's fence above every token the old one accepted: Retire left the old
	// fence at (era+1, MaxInt64), above all of them, and a token of a later era with epoch 0
	// is above that, below every claim the next owner makes in that era.
	tok, err := seed(ctx, dst, k, old.Token, seededBy(version), what+": seed on "+to)
	if err != nil {
		return fmt.Errorf("shard: %s: seeding the fence: %w", what, err)
	}

	// 3. The copy, in the transaction that advances the new fence to the old one's position:
	// the rows and the position commit together or not at all, so a resumed move copies
	// again exactly when the position is not there yet.
	if old.Position != fence.NoPosition {
		err := dst.Apply(ctx, k, tok, old.Position, old.Position, func(ctx context.Context, tx Tx) error {
			if copy == nil {
				return nil
			}
			return copy(ctx, k, from, tx)
		})
		switch {
		case errors.Is(err, fence.ErrDuplicate):
			st, lerr := dst.Load(ctx, k)
			if lerr != nil {
				return fmt.Errorf("shard: %s: %w", what, lerr)
			}
			if st.Position != old.Position {
				return fmt.Errorf("%w: shard: %s: the fence on %s stands at position %d, past the old shard's %d", fence.ErrConflict, what, to, st.Position, old.Position)
			}
		case err != nil:
			return fmt.Errorf("shard: %s: copying the partition: %w", what, err)
		}
	}

	// 4. The placement, which Publish stores only if steps 1 to 3 are done.
	next := Placement{Version: version, Shards: cur.Shards, Entries: maps.Clone(cur.Entries)}
	if next.Entries == nil {
		next.Entries = map[fence.Key]string{}
	}
	next.Entries[k] = to
	return r.Publish(ctx, next, what+": publish")
}

// seed makes k's fence on s stand above above, held by claimant (reserved: no consumer can
// present it), with epoch 0, and returns its token. Only Recover raises an era, one at a time,
// so a fence whose era is not above above's climbs through recorded recoveries; a fence
// already seeded by claimant above it is kept as it is.
func seed[Tx any](ctx context.Context, s Shard[Tx], k fence.Key, above fence.Token, claimant, reason string) (fence.Token, error) {
	for {
		st, err := s.Load(ctx, k)
		if err != nil {
			return fence.Token{}, err
		}
		if st.Claimant == claimant && st.Token.Compare(above) > 0 {
			return st.Token, nil
		}
		_, err = s.Recover(ctx, k, st.Token, 0, claimant, reason)
		if err != nil && !errors.Is(err, fence.ErrConflict) {
			return fence.Token{}, err
		}
	}
}
