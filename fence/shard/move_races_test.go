package shard

import (
	"context"
	"database/sql"
	"testing"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/sqliteoutbox"
)

// Two operators move one key at once, to different shards: the second one's publication runs
// the whole first move. One placement wins; the loser's seeded copy on c is never routed to, no
// token of the old placement writes anywhere, and a later move to c copies what the winner's
// shard applied since, not the loser's stale copy.
func TestTwoMovesOfOneKeyToDifferentShards(t *testing.T) {
	shards, stores, pl := liteShards(t, names3...)
	hooked := &publishHook{Placements: pl}
	op1 := newRouter(t, shards, pl)
	op2 := newRouter(t, shards, hooked)
	ctx := t.Context()
	k := keyOn(t, op1.Placement(), "g", "a")
	_, err := op1.Claim(ctx, k, tok(0, 5), "m1")
	must(t, err)
	must(t, op1.Apply(ctx, k, tok(0, 5), 0, 10, func(ctx context.Context, tx *sql.Tx) error {
		return writeLite(ctx, tx, "device-1", "v10")
	}))
	calls := 0
	hooked.before = func() { must(t, op1.Move(ctx, k, "b", copyKV(stores, &calls))) }
	wantIs(t, "the second operator's publication", op2.Move(ctx, k, "c", copyKV(stores, &calls)), fence.ErrConflict)
	fresh := newRouter(t, shards, pl)
	if p := fresh.Placement(); p.Version != 2 || p.Shard(k) != "b" {
		t.Fatalf("placement %d puts %s on %s, want 2 and b", p.Version, k, p.Shard(k))
	}
	for _, n := range names3 {
		err := shards[n].Apply(ctx, k, tok(0, 5), 11, 11, func(ctx context.Context, tx *sql.Tx) error {
			return writeLite(ctx, tx, "device-1", "zombie")
		})
		wantIs(t, "the old owner's write on "+n, err, fence.ErrStale)
		_, err = shards[n].Claim(ctx, k, tok(0, 6), "m1")
		wantIs(t, "a claim of the old era on "+n, err, fence.ErrStale)
	}
	st, err := fresh.Load(ctx, k)
	must(t, err)
	next := fence.Token{Era: st.Token.Era, Epoch: 6}
	_, err = fresh.Claim(ctx, k, next, "m2")
	must(t, err)
	must(t, fresh.Apply(ctx, k, next, 11, 20, func(ctx context.Context, tx *sql.Tx) error {
		return writeLite(ctx, tx, "device-1", "v20")
	}))
	must(t, fresh.Move(ctx, k, "c", copyKV(stores, &calls)))
	if got := readKV(t, stores["c"], "device-1"); got != "v20" {
		t.Fatalf("c holds device-1 = %q after the move from b, want b's v20", got)
	}
	st, err = stores["c"].Load(ctx, k)
	must(t, err)
	if st.Position != 20 {
		t.Fatalf("c's fence stands at %d after the move from b, want 20", st.Position)
	}
}

// Two operators move one key to the same shard at once: the partition is copied once and the
// key is published once, on that shard.
func TestTwoMovesOfOneKeyToOneShard(t *testing.T) {
	shards, stores, pl := liteShards(t, names3...)
	hooked := &publishHook{Placements: pl}
	op1 := newRouter(t, shards, pl)
	op2 := newRouter(t, shards, hooked)
	ctx := t.Context()
	k := keyOn(t, op1.Placement(), "g", "a")
	_, err := op1.Claim(ctx, k, tok(0, 5), "m1")
	must(t, err)
	must(t, op1.Apply(ctx, k, tok(0, 5), 0, 10, func(ctx context.Context, tx *sql.Tx) error {
		return writeLite(ctx, tx, "device-1", "v10")
	}))
	calls := 0
	hooked.before = func() { must(t, op1.Move(ctx, k, "b", copyKV(stores, &calls))) }
	_ = op2.Move(ctx, k, "b", copyKV(stores, &calls)) // its publication loses the race
	if p := op1.Placement(); calls != 1 || p.Version != 2 || p.Shard(k) != "b" {
		t.Fatalf("two moves to b: %d copies, placement %d puts %s on %s; want 1, 2 and b", calls, p.Version, k, p.Shard(k))
	}
	must(t, op2.Move(ctx, k, "b", copyKV(stores, &calls)))
	if calls != 1 || readKV(t, stores["b"], "device-1") != "v10" {
		t.Fatalf("after a repeated move: %d copies, b holds %q", calls, readKV(t, stores["b"], "device-1"))
	}
}

// The old shard's relay runs under the old owner's token: once the key is retired there, it
// can neither read nor mark nor dead-letter the partition's rows, so only the new shard's
// relay, under the new owner's token, moves the cursor.
func TestRetireFencesTheOldShardsRelay(t *testing.T) {
	shards, stores, pl := liteShards(t, names3...)
	r := newRouter(t, shards, pl)
	ctx := t.Context()
	box, err := sqliteoutbox.New(stores["a"])
	must(t, err)
	must(t, box.Migrate(ctx))
	k := keyOn(t, r.Placement(), "g", "a")
	old := tok(0, 5)
	_, err = r.Claim(ctx, k, old, "m1")
	must(t, err)
	must(t, r.Apply(ctx, k, old, 0, 10, func(ctx context.Context, tx *sql.Tx) error {
		return box.Append(ctx, tx, k, old, outbox.Message{Topic: "commands", Value: []byte("m-1")})
	}))
	rows, err := box.Pending(ctx, k, old, 10)
	must(t, err)
	must(t, r.Move(ctx, k, "b", nil))
	_, err = box.Pending(ctx, k, old, 10)
	wantIs(t, "the old relay's read", err, fence.ErrStale)
	_, err = box.MarkDelivered(ctx, k, old, rows[0].Seq)
	wantIs(t, "the old relay's mark", err, fence.ErrStale)
	_, err = box.DeadLetter(ctx, k, old, rows[0].Seq, "given up")
	wantIs(t, "the old relay's dead letter", err, fence.ErrStale)
	wantIs(t, "the old owner's append", r.Apply(ctx, k, old, 11, 11, func(ctx context.Context, tx *sql.Tx) error {
		return box.Append(ctx, tx, k, old, outbox.Message{Topic: "commands", Value: []byte("m-2")})
	}), fence.ErrStale)
}

// A move interrupted after its copy, then a topic reset (every fence of the topic to a new era,
// position -1, the retirement on a gone: placement 1 is in force and puts k on a), then the
// owner of placement 1 claims and applies the new topic's records on a: Move run again retires
// a again, copies what a applied since, and leaves no token of a's claimable on b.
func TestMoveResumedAfterATopicResetBeforeItsPublication(t *testing.T) {
	shards, stores, pl := liteShards(t, names3...)
	crashing := &crashingPublish{Placements: pl}
	r := newRouter(t, shards, crashing)
	ctx := t.Context()
	idA, idB := fence.Topic{ID: "idA", Partitions: 64}, fence.Topic{ID: "idB", Partitions: 64}
	_, _, err := r.SeeTopic(ctx, "g", "t", idA, "first claim")
	must(t, err)
	k := keyOn(t, r.Placement(), "g", "a")
	_, err = r.Claim(ctx, k, tok(0, 5), "m1")
	must(t, err)
	must(t, r.Apply(ctx, k, tok(0, 5), 0, 10, func(ctx context.Context, tx *sql.Tx) error {
		return writeLite(ctx, tx, "device-1", "v10")
	}))
	calls := 0
	crashing.crash = true
	if err := r.Move(ctx, k, "b", copyKV(stores, &calls)); err == nil {
		t.Fatal("Move with a failing publication succeeded")
	}
	crashing.crash = false
	must(t, r.ResetTopic(ctx, "g", "t", idA, idB, "recreated"))
	// The reset keeps a's fence retired (sealed) for the pending move: the key waits for it.
	st, err := r.Load(ctx, k)
	must(t, err)
	stale := fence.Token{Era: st.Token.Era, Epoch: 5}
	_, err = r.Claim(ctx, k, stale, "m1")
	wantIs(t, "a claim on a after the reset, the move pending", err, ErrMoved)
	must(t, r.Move(ctx, k, "b", copyKV(stores, &calls)))
	st, err = r.Load(ctx, k)
	must(t, err)
	owner := fence.Token{Era: st.Token.Era, Epoch: 5}
	_, err = r.Claim(ctx, k, owner, "m1")
	must(t, err)
	must(t, r.Apply(ctx, k, owner, 0, 5, func(ctx context.Context, tx *sql.Tx) error {
		return writeLite(ctx, tx, "device-1", "new-5")
	}))
	if got := readKV(t, stores["b"], "device-1"); got != "new-5" {
		t.Fatalf("after the resumed move and a batch, b holds %q; want new-5", got)
	}
	dst, err := stores["b"].Load(ctx, k)
	must(t, err)
	if dst.Position != 5 {
		t.Fatalf("b's fence stands at %d, want 5", dst.Position)
	}
	src, err := stores["a"].Load(ctx, k)
	must(t, err)
	if !retired(src.Claimant) || dst.Token.Compare(src.Token) <= 0 {
		t.Fatalf("a's fence %+v, b's %+v: want a retired below b", src, dst)
	}
	wantIs(t, "a write on a after the move", shards["a"].Apply(ctx, k, stale, 6, 6, func(context.Context, *sql.Tx) error { return nil }), fence.ErrStale)
}
