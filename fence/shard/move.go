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

// moveAttempts bounds how many newer placements (other keys' moves published meanwhile) Move
// follows before it gives up with fence.ErrConflict.
const moveAttempts = 16

// Move runs the steps of a move in order; each one first looks at what a previous, interrupted
// run left and does only what is missing. A placement published meanwhile by another move
// (Retire or Publish then fail with fence.ErrConflict) makes it redo the steps for the next
// version, if that placement leaves k where it was: the retirement and the seed are renewed
// for it, and a copy that committed is not run again. A placement that moved k itself ends
// the move with the conflict: the operator decides again.
func (r *router[Tx]) Move(ctx context.Context, k fence.Key, to string, copy func(ctx context.Context, k fence.Key, from string, tx Tx) error) error {
	var err error
	from := ""
	for range moveAttempts {
		var again bool
		if again, err = r.moveOnce(ctx, k, to, &from, copy); !again {
			return err
		}
	}
	return err
}

// moveOnce runs the move's steps for the version above the placement in force, and reports
// whether a newer placement refused them (run them again for the next version). *was is the
// shard k lived on at the first attempt ("" before it); a later attempt that finds k
// elsewhere fails with fence.ErrConflict.
func (r *router[Tx]) moveOnce(ctx context.Context, k fence.Key, to string, was *string, copy func(ctx context.Context, k fence.Key, from string, tx Tx) error) (bool, error) {
	dst, ok := r.shards[to]
	if !ok {
		return false, fmt.Errorf("%w: shard: moving %s to shard %q, which this router was not given", fence.ErrInvalid, k, to)
	}
	cur, err := r.reload(ctx)
	if err != nil {
		return false, err
	}
	from := cur.Shard(k)
	if *was != "" && *was != from {
		return false, fmt.Errorf("%w: shard: moving %s from shard %s to shard %s: placement %d, published meanwhile, put it on shard %s", fence.ErrConflict, k, *was, to, cur.Version, from)
	}
	*was = from
	if _, ok := r.shards[from]; !ok {
		return false, fmt.Errorf("%w: shard: %s is placed on shard %q, which this router was not given", fence.ErrInvalid, k, from)
	}
	version := cur.Version + 1
	if from == to {
		// Nothing to move, unless a move of k away from here is under way: its retirement
		// for the next version refuses k here until that move is finished.
		st, err := r.shards[from].Load(ctx, k)
		if err != nil {
			return false, err
		}
		if st.Claimant == retiredBy(version) {
			return false, fmt.Errorf("%w: shard: %s lives on shard %s, where a move of it for placement %d is under way (its fence is retired for it): finish that move by running Move to its destination", fence.ErrConflict, k, to, version)
		}
		return false, nil
	}
	what := fmt.Sprintf("move %s from shard %s to shard %s (placement %d)", k, from, to, version)

	// 0. A move not begun yet (k's fence on from is not retired) is refused where the copy's
	// position could not tell a copy to make from one made: the copy runs in the transaction
	// that advances the new fence to the old one's position, so it needs the old position
	// above both NoPosition and the new fence's.
	if err := refuseUncopyable(ctx, r.shards[from], dst, k, what); err != nil {
		return false, err
	}

	// 1. The old shard refuses k for ever; the batch in flight there, if any, ends first.
	if err := r.Retire(ctx, k, version, what+": retire on "+from); err != nil {
		return errors.Is(err, fence.ErrConflict), err
	}
	old, err := r.shards[from].Load(ctx, k)
	if err != nil {
		return false, fmt.Errorf("shard: %s: loading the retired fence: %w", what, err)
	}

	// 2. The new shard's fence above every token the old one accepted: Retire left the old
	// fence at (era+1, MaxInt64), above all of them, and a sealed token of a later era is
	// above that; Publish opens it to the era after, below every claim the next owner makes
	// there.
	tok, err := seed(ctx, dst, k, old.Token, seededBy(version), what+": seed on "+to)
	if err != nil {
		return false, fmt.Errorf("shard: %s: seeding the fence: %w", what, err)
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
				return false, fmt.Errorf("shard: %s: %w", what, lerr)
			}
			if st.Position != old.Position {
				return false, fmt.Errorf("%w: shard: %s: the fence on %s stands at position %d, past the old shard's %d", fence.ErrConflict, what, to, st.Position, old.Position)
			}
		case err != nil:
			return false, fmt.Errorf("shard: %s: copying the partition: %w", what, err)
		}
	}

	// 4. The placement, which Publish stores only if steps 1 to 3 are done.
	next := Placement{Version: version, Shards: cur.Shards, Entries: maps.Clone(cur.Entries)}
	if next.Entries == nil {
		next.Entries = map[fence.Key]string{}
	}
	next.Entries[k] = to
	err = r.Publish(ctx, next, what+": publish")
	return errors.Is(err, fence.ErrConflict), err
}

// seed makes k's fence on s stand above above, held by claimant (reserved: no consumer can
// present it), sealed (epoch MaxInt64: no claim reaches it, and a topic reset keeps it and
// its claimant) until the placement is published and the fence is opened, and returns its
// token. Only Recover raises an era, one at a time,
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
		_, err = s.Recover(ctx, k, st.Token, retiredEpoch, claimant, reason)
		if err != nil && !errors.Is(err, fence.ErrConflict) {
			return fence.Token{}, err
		}
	}
}

// refuseUncopyable refuses, before anything of a move is done, a key whose rows the copy step
// could miss: a fence on from with no applied position but an era above 0 (a topic reset or a
// recovery: the shard may hold rows of the key, for an earlier incarnation or an earlier stay,
// that no position points at), and a key going back to a shard whose fence stands at from's
// position (it applied nothing since it left: the rows are there, but the relay's marks and
// every row changed without a batch would not be copied). Both wait for the partition's next
// batch. A move under way (the fence on from retired) passed this check when it began.
func refuseUncopyable[Tx any](ctx context.Context, src, dst Shard[Tx], k fence.Key, what string) error {
	st, err := src.Load(ctx, k)
	if err != nil {
		return fmt.Errorf("shard: %s: %w", what, err)
	}
	if retired(st.Claimant) {
		return nil
	}
	if st.Position == fence.NoPosition && st.Token.Era > 0 {
		return fmt.Errorf("%w: shard: %s: its fence there has applied nothing since a topic reset or a recovery (era %d), so no position says what to copy: move it after its next batch", fence.ErrConflict, what, st.Token.Era)
	}
	back, err := dst.Load(ctx, k)
	if err != nil {
		return fmt.Errorf("shard: %s: %w", what, err)
	}
	if st.Position != fence.NoPosition && back.Position == st.Position {
		return fmt.Errorf("%w: shard: %s: it applied nothing since it left that shard (both fences at position %d), so no position says what to copy: move it after its next batch", fence.ErrConflict, what, st.Position)
	}
	return nil
}
