package shard

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
)

func tok(era, epoch int64) fence.Token { return fence.Token{Era: era, Epoch: epoch} }

// unreachable is a placement store whose reads fail while down is set: a home shard that
// cannot be reached.
type unreachable struct {
	Placements
	down bool
}

func (u *unreachable) Load(ctx context.Context) (Placement, error) {
	if u.down {
		return Placement{}, errors.New("home shard unreachable")
	}
	return u.Placements.Load(ctx)
}

// move moves k to the shard to with the router's Move, copying nothing but the fence.
func move(t *testing.T, r Router[*sql.Tx], k fence.Key, to string) {
	t.Helper()
	must(t, r.Move(t.Context(), k, to, nil))
}

func TestRoutesEachKeyToItsShard(t *testing.T) {
	shards, stores, pl := liteShards(t, names3...)
	r := newRouter(t, shards, pl)
	ctx := t.Context()
	per := map[string]int{}
	for p := int32(0); p < 12; p++ {
		k := fence.Key{Group: "g", Topic: "t", Partition: p}
		_, err := r.Claim(ctx, k, tok(0, 1), "m")
		must(t, err)
		must(t, r.Apply(ctx, k, tok(0, 1), 0, 0, func(ctx context.Context, tx *sql.Tx) error {
			return writeLite(ctx, tx, k.String(), "v")
		}))
		per[r.Placement().Shard(k)]++
	}
	for _, n := range names3 {
		if per[n] != 4 {
			t.Errorf("the rule placed %d of 12 partitions on %s, want 4", per[n], n)
		}
		if got := countLite(t, stores[n]); got != per[n] {
			t.Errorf("shard %s holds %d rows, want %d: the rows of the partitions placed there", n, got, per[n])
		}
	}
}

// A consumer whose claim is refused as stale recovers after the coordinator confirms it owns
// the partition. On a retired fence that would raise the era again and let it write on a
// shard its key left: the router refuses.
func TestRecoverRefusedOnRetiredFence(t *testing.T) {
	shards, stores, pl := liteShards(t, names3...)
	r := newRouter(t, shards, pl)
	ctx := t.Context()
	k := keyOn(t, r.Placement(), "g", "a")
	_, err := r.Claim(ctx, k, tok(0, 5), "m1")
	must(t, err)
	must(t, r.Retire(ctx, k, 2, "moving to b"))
	// Between the retirement and the publication, the placement in force still says a.
	_, err = r.Claim(ctx, k, tok(1, 6), "m2")
	var stale *fence.StaleError
	if !errors.As(err, &stale) {
		t.Fatalf("claim of a retired fence = %v, want stale", err)
	}
	_, err = r.Recover(ctx, k, stale.Stored, 6, "m2", "verified owner")
	wantIs(t, "Recover of a retired fence", err, ErrMoved)
	st, err := stores["a"].Load(ctx, k)
	must(t, err)
	if !retired(st.Claimant) {
		t.Fatalf("fence on a after the refused recovery = %+v, want still retired", st)
	}
}

func TestRetiredClaimantRefused(t *testing.T) {
	shards, _, pl := liteShards(t, names3...)
	r := newRouter(t, shards, pl)
	k := keyOn(t, r.Placement(), "g", "a")
	_, err := r.Claim(t.Context(), k, tok(0, 1), retiredBy(2))
	wantIs(t, "Claim by a retired fence's claimant", err, fence.ErrInvalid)
	must(t, r.Retire(t.Context(), k, 2, "moving"))
	// Holding the marker would let a consumer write under a retired fence's own token.
	_, err = r.Claim(t.Context(), k, tok(0, retiredEpoch), retiredBy(2))
	wantIs(t, "re-claim of a retired token by its marker", err, fence.ErrInvalid)
	_, err = r.Recover(t.Context(), k, tok(1, retiredEpoch), 1, retiredBy(3), "x")
	wantIs(t, "Recover by a retired fence's claimant", err, fence.ErrInvalid)
}

func TestPublishRefusesMoveOfLiveFence(t *testing.T) {
	shards, stores, pl := liteShards(t, names3...)
	r := newRouter(t, shards, pl)
	ctx := t.Context()
	k := keyOn(t, r.Placement(), "g", "a")
	_, err := r.Claim(ctx, k, tok(0, 5), "m1")
	must(t, err)
	// b's fence above a's and at its position: only the retirement is missing.
	_, err = stores["b"].Recover(ctx, k, fence.Token{}, 0, "seeder", "seed above a")
	must(t, err)
	next := Placement{Version: 2, Shards: names3, Entries: map[fence.Key]string{k: "b"}}
	wantIs(t, "Publish moving a live fence", r.Publish(ctx, next, "move"), ErrMoved)
	if got := r.Placement().Version; got != 1 {
		t.Fatalf("placement in force after a refused publish = %d, want 1", got)
	}
	must(t, r.Retire(ctx, k, 2, "move"))
	// Retired at (1, MaxInt64): b's (1, 0) is below it, so m1's token would not be the
	// lowest thing b refuses. Move seeds b above.
	wantIs(t, "Publish moving a key to a fence not above the retired one", r.Publish(ctx, next, "move"), ErrMoved)
	must(t, r.Move(ctx, k, "b", nil))
	if got := r.Placement().Shard(k); got != "b" {
		t.Fatalf("%s routed to %s after the move, want b", k, got)
	}
	wantIs(t, "Publish of a stale version", r.Publish(ctx, next, "again"), fence.ErrConflict)
	other := Placement{Version: 3, Shards: []string{"a", "b"}, Entries: next.Entries}
	wantIs(t, "Publish changing the rule", r.Publish(ctx, other, "rule"), fence.ErrInvalid)
	dropped := Placement{Version: 3, Shards: names3}
	wantIs(t, "Publish dropping an entry", r.Publish(ctx, dropped, "drop"), fence.ErrInvalid)
}

// The interleaving of a move with a batch in flight: a member applies a batch of k on shard a
// under placement 1 while the operator moves k to b. The retirement waits for the batch, and
// after it no write of k lands on a, whatever placement the member holds.
func TestMoveDuringBatchNeverWritesOldShard(t *testing.T) {
	shards, stores, pl := liteShards(t, names3...)
	home := &unreachable{Placements: pl}
	member := newRouter(t, shards, home)
	operator := newRouter(t, shards, pl)
	ctx := t.Context()
	k := keyOn(t, member.Placement(), "g", "a")
	_, err := member.Claim(ctx, k, tok(0, 5), "m1")
	must(t, err)

	inBatch, release := make(chan struct{}), make(chan struct{})
	applied := make(chan error, 1)
	go func() {
		applied <- member.Apply(ctx, k, tok(0, 5), 10, 10, func(ctx context.Context, tx *sql.Tx) error {
			close(inBatch)
			<-release
			return writeLite(ctx, tx, "in-flight", "v")
		})
	}()
	<-inBatch
	retiredAt := make(chan error, 1)
	go func() { retiredAt <- operator.Retire(ctx, k, 2, "move to b") }()
	select {
	case err := <-retiredAt:
		t.Fatalf("Retire returned (%v) while a batch of the key was in flight on the shard", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	must(t, <-applied)
	must(t, <-retiredAt)
	// The member's router cannot read the home shard: it keeps placement 1, and a, for k.
	home.down = true
	must(t, operator.Move(ctx, k, "b", nil)) // finishes the move begun by the Retire above
	err = member.Apply(ctx, k, tok(0, 5), 11, 11, func(ctx context.Context, tx *sql.Tx) error {
		return writeLite(ctx, tx, "after-move", "v")
	})
	wantIs(t, "Apply on the old shard after the retirement", err, fence.ErrStale)
	// A claim afresh through the stale placement: refused, and its recovery too.
	st, err := member.Load(ctx, k)
	must(t, err)
	_, err = member.Claim(ctx, k, fence.Token{Era: st.Token.Era, Epoch: 6}, "m2")
	wantIs(t, "claim in the retired fence's era", err, fence.ErrStale)
	_, err = member.Recover(ctx, k, st.Token, 6, "m2", "verified owner")
	wantIs(t, "recover of the retired fence", err, ErrMoved)
	if n := countLite(t, stores["a"]); n != 1 {
		t.Fatalf("shard a holds %d rows, want only the batch that committed before the retirement", n)
	}
	// The home shard back: the member's next claim reaches b.
	home.down = false
	if _, err := member.Load(ctx, k); err != nil {
		t.Fatal(err)
	}
	if got := member.Placement().Shard(k); got != "b" {
		t.Fatalf("member routes %s to %s after reading placement 2, want b", k, got)
	}
	st, err = member.Load(ctx, k)
	must(t, err)
	_, err = member.Claim(ctx, k, fence.Token{Era: st.Token.Era, Epoch: 6}, "m2")
	must(t, err)
	must(t, member.Apply(ctx, k, fence.Token{Era: st.Token.Era, Epoch: 6}, 11, 11, func(ctx context.Context, tx *sql.Tx) error {
		return writeLite(ctx, tx, "after-move", "v")
	}))
	if n := countLite(t, stores["b"]); n != 1 {
		t.Fatalf("shard b holds %d rows, want the batch applied after the move", n)
	}
}

func TestRetireNeverClaimedFence(t *testing.T) {
	shards, _, pl := liteShards(t, names3...)
	r := newRouter(t, shards, pl)
	k := keyOn(t, r.Placement(), "g", "c")
	must(t, r.Retire(t.Context(), k, 2, "move"))
	must(t, r.Retire(t.Context(), k, 2, "move again")) // idempotent
	_, err := r.Claim(t.Context(), k, tok(0, 1), "m")
	wantIs(t, "claim of a retired, never claimed fence", err, fence.ErrStale)
	wantIs(t, "Retire for a version not next", r.Retire(t.Context(), k, 3, "skip"), fence.ErrConflict)
}

// Resetting a recreated topic moves every fence of the topic on a shard to a new era without a
// claimant, retired ones included: the router retires those again.
func TestResetTopicKeepsRetiredFencesRetired(t *testing.T) {
	shards, stores, pl := liteShards(t, names3...)
	r := newRouter(t, shards, pl)
	ctx := t.Context()
	k := keyOn(t, r.Placement(), "g", "a")
	idA, idB := fence.Topic{ID: "idA", Partitions: 64}, fence.Topic{ID: "idB", Partitions: 64}
	_, _, err := r.SeeTopic(ctx, "g", "t", idA, "first claim")
	must(t, err)
	_, err = r.Claim(ctx, k, tok(0, 5), "m1")
	must(t, err)
	move(t, r, k, "b")
	must(t, r.ResetTopic(ctx, "g", "t", idA, idB, "recreated"))
	st, err := stores["a"].Load(ctx, k)
	must(t, err)
	if !retired(st.Claimant) {
		t.Fatalf("fence of %s on a after the reset = %+v, want retired", k, st)
	}
	for _, n := range names3 {
		got, _, err := latest(ctx, shards[n], "g", "t")
		must(t, err)
		if got != idB {
			t.Errorf("shard %s stores %s after the reset, want %s", n, got, idB)
		}
	}
	// Done: the home shard stores idB, and a repeat is refused as by a single store.
	wantIs(t, "a repeated reset", r.ResetTopic(ctx, "g", "t", idA, idB, "again"), fence.ErrConflict)
}

// A shard's transaction carries its shard: Advance of a key of another shard inside it fails,
// and Admit lands in that shard's keyed fences.
func TestAdmitInTheKeysShard(t *testing.T) {
	shards, stores, pl := liteShards(t, names3...)
	r := newRouter(t, shards, pl)
	ctx := t.Context()
	ka, kb := keyOn(t, r.Placement(), "g", "a"), keyOn(t, r.Placement(), "g", "b")
	_, err := r.Claim(ctx, kb, tok(0, 1), "m")
	must(t, err)
	_, err = r.Claim(ctx, ka, tok(0, 1), "m")
	must(t, err)
	must(t, r.Apply(ctx, kb, tok(0, 1), 0, 0, func(ctx context.Context, tx *sql.Tx) error {
		wantIs(t, "Advance of a's key in b's transaction", r.Advance(ctx, tx, ka, tok(0, 1), 0, 0), ErrMoved)
		v, err := r.Admit(ctx, tx, "inbox|b", "e1", tok(0, 1), 1)
		if err == nil && v != fence.Admitted {
			t.Errorf("Admit = %s, want admitted", v)
		}
		return err
	}))
	var n int
	must(t, stores["b"].DB().QueryRow(`SELECT count(*) FROM `+stores["b"].Table()+`_keyed`).Scan(&n))
	if n != 1 {
		t.Fatalf("b holds %d keyed rows, want 1", n)
	}
	_, err = r.Admit(ctx, nil, "inbox|b", "e1", tok(0, 1), 2)
	wantIs(t, "Admit outside the router's Apply", err, fence.ErrInvalid)
}

func TestNewRefuses(t *testing.T) {
	shards, _, pl := liteShards(t, names3...)
	_, err := New(t.Context(), "z", shards, pl)
	wantIs(t, "unknown home", err, fence.ErrInvalid)
	delete(shards, "c")
	_, err = New(t.Context(), "a", shards, pl)
	wantIs(t, "placement naming a missing shard", err, fence.ErrInvalid)
	_, err = New[*sql.Tx](t.Context(), "a", shards, nil)
	wantIs(t, "nil placements", err, fence.ErrInvalid)
}

func TestPlacementRoundTrip(t *testing.T) {
	p := Placement{Version: 3, Shards: names3, Entries: map[fence.Key]string{{Group: "g", Topic: "t", Partition: 1}: "d"}}
	s, err := encode(p)
	must(t, err)
	q, err := decode(3, s)
	must(t, err)
	if q.Version != 3 || len(q.Entries) != 1 || q.Shard(fence.Key{Group: "g", Topic: "t", Partition: 1}) != "d" {
		t.Fatalf("decode(encode(%+v)) = %+v", p, q)
	}
	for _, bad := range []Placement{{Version: 0, Shards: names3}, {Version: 1}, {Version: 1, Shards: []string{"a", "a"}}, {Version: 1, Shards: []string{""}}} {
		if err := bad.validate(); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("validate(%+v) = %v, want ErrInvalid", bad, err)
		}
	}
}

// A placement naming a shard the router was not given is reported at the next claim step,
// and the router keeps routing by the placement it holds.
func TestPlacementNamingUnknownShard(t *testing.T) {
	shards, _, pl := liteShards(t, names3...)
	r := newRouter(t, shards, pl)
	k := keyOn(t, r.Placement(), "g", "a")
	must(t, pl.Publish(t.Context(), Placement{Version: 2, Shards: names3, Entries: map[fence.Key]string{k: "d"}}, "a shard this member lacks"))
	_, err := r.Load(t.Context(), k)
	wantIs(t, "Load under a placement naming an unknown shard", err, fence.ErrInvalid)
	if v := r.Placement().Version; v != 1 {
		t.Fatalf("placement in force = %d, want 1 kept", v)
	}
}

// seedFence sets k's fence on s above the token above and at position pos, as a move's seed
// and copy steps do before the placement is published.
func seedFence(t *testing.T, s *sqlitefence.Store, k fence.Key, above fence.Token, pos int64) {
	t.Helper()
	tk, err := seed(t.Context(), Shard[*sql.Tx](s), k, above, seededBy(2), "seed")
	must(t, err)
	if pos != fence.NoPosition {
		must(t, s.Apply(t.Context(), k, tk, pos, pos, func(context.Context, *sql.Tx) error { return nil }))
	}
}

// A move published before the new shard holds what the old one applied would resume the
// partition there from an earlier offset: records re-applied to rows that never saw the ones
// before them. Publish refuses until the new shard's fence stands at the old one's position.
func TestPublishRefusesMoveBeforeTheNewShardHoldsThePosition(t *testing.T) {
	shards, stores, pl := liteShards(t, names3...)
	r := newRouter(t, shards, pl)
	ctx := t.Context()
	k := keyOn(t, r.Placement(), "g", "a")
	_, err := r.Claim(ctx, k, tok(0, 5), "m1")
	must(t, err)
	must(t, r.Apply(ctx, k, tok(0, 5), 0, 10, func(ctx context.Context, tx *sql.Tx) error {
		return writeLite(ctx, tx, "k", "v")
	}))
	must(t, r.Retire(ctx, k, 2, "move to b"))
	retiredAt, err := stores["a"].Load(ctx, k)
	must(t, err)
	seedFence(t, stores["b"], k, retiredAt.Token, fence.NoPosition)
	next := Placement{Version: 2, Shards: names3, Entries: map[fence.Key]string{k: "b"}}
	err = r.Publish(ctx, next, "move to b")
	wantIs(t, "Publish moving a key its new shard has not caught up with", err, ErrMoved)
	if err != nil && !strings.Contains(err.Error(), "whose fence stands at -1") {
		t.Fatalf("Publish = %v, want the new shard's position named", err)
	}
	seedFence(t, stores["b"], k, retiredAt.Token, 9)
	wantIs(t, "Publish moving a key its new shard holds only in part", r.Publish(ctx, next, "move to b"), ErrMoved)
	if got := r.Placement().Version; got != 1 {
		t.Fatalf("placement in force after the refused publishes = %d, want 1", got)
	}
	st, err := stores["b"].Load(ctx, k)
	must(t, err)
	must(t, stores["b"].Apply(ctx, k, st.Token, 10, 10, func(context.Context, *sql.Tx) error { return nil }))
	must(t, r.Publish(ctx, next, "move to b"))
	if got := r.Placement().Shard(k); got != "b" {
		t.Fatalf("%s routed to %s after the move, want b", k, got)
	}
}
