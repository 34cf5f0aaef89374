package shard

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
)

// copyKV returns a copy function that copies shard from's kv rows (every row: the tests keep
// one partition's rows per database) into the new shard's transaction, counting its calls.
func copyKV(stores map[string]*sqlitefence.Store, calls *int) func(ctx context.Context, k fence.Key, from string, tx *sql.Tx) error {
	return func(ctx context.Context, k fence.Key, from string, tx *sql.Tx) error {
		*calls++
		// The copy contract: the destination's rows of the partition (here every kv row)
		// become the source's, so rows left from an earlier stay are deleted first.
		if _, err := tx.ExecContext(ctx, `DELETE FROM kv`); err != nil {
			return err
		}
		rows, err := stores[from].DB().QueryContext(ctx, `SELECT k, v FROM kv`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var key, v string
			if err := rows.Scan(&key, &v); err != nil {
				return err
			}
			if err := writeLite(ctx, tx, key, v); err != nil {
				return err
			}
		}
		return rows.Err()
	}
}

// readKV returns shard s's value for key, "" if none.
func readKV(t *testing.T, s *sqlitefence.Store, key string) string {
	t.Helper()
	var v string
	err := s.DB().QueryRow(`SELECT v FROM kv WHERE k = ?`, key).Scan(&v)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		t.Fatal(err)
	}
	return v
}

// The owner of k on a, frozen with its token (0, 5) while k moves to b, resumes its batch: its
// write is refused on a, the shard its old placement names, and on b, the shard a fresh
// placement names, and so is its claim there. The next owner claims on b, in the era the
// move seeded, and resumes after the position a had applied, on the rows a held.
func TestMoveRefusesOldPlacementTokensOnBothShards(t *testing.T) {
	shards, stores, pl := liteShards(t, names3...)
	home := &unreachable{Placements: pl}
	zombie := newRouter(t, shards, home) // keeps placement 1
	operator := newRouter(t, shards, pl)
	ctx := t.Context()
	k := keyOn(t, operator.Placement(), "g", "a")
	old := tok(0, 5)
	_, err := zombie.Claim(ctx, k, old, "m1")
	must(t, err)
	must(t, zombie.Apply(ctx, k, old, 0, 10, func(ctx context.Context, tx *sql.Tx) error {
		return writeLite(ctx, tx, "device-1", "v10")
	}))
	home.down = true
	calls := 0
	must(t, operator.Move(ctx, k, "b", copyKV(stores, &calls)))
	if got := operator.Placement().Shard(k); got != "b" || calls != 1 {
		t.Fatalf("after Move: %s on %s with %d copies, want b and 1", k, got, calls)
	}
	if got := readKV(t, stores["b"], "device-1"); got != "v10" {
		t.Fatalf("b holds device-1 = %q after the move, want the row a held, v10", got)
	}
	write := func(r Router[*sql.Tx], tk fence.Token, v string) error {
		return r.Apply(ctx, k, tk, 11, 11, func(ctx context.Context, tx *sql.Tx) error {
			return writeLite(ctx, tx, "device-1", v)
		})
	}
	// The zombie's batch through its old placement reaches a.
	err = write(zombie, old, "zombie")
	wantIs(t, "the zombie's Apply on a", err, fence.ErrStale)
	wantIs(t, "the zombie's Apply on a", err, ErrMoved)
	// Through a fresh placement it reaches b.
	fresh := newRouter(t, shards, pl)
	wantIs(t, "the zombie's Apply on b", write(fresh, old, "zombie"), fence.ErrStale)
	_, err = fresh.Claim(ctx, k, old, "m1")
	wantIs(t, "the zombie's claim on b", err, fence.ErrStale)
	_, err = fresh.Claim(ctx, k, tok(0, 6), "m2")
	wantIs(t, "a claim on b in the old era", err, fence.ErrStale)
	for _, n := range []string{"a", "b"} {
		if got := readKV(t, stores[n], "device-1"); got != "v10" {
			t.Fatalf("%s holds device-1 = %q after the zombie's writes, want v10", n, got)
		}
	}
	// The next owner loads b, claims in b's era at its generation, and resumes after 10.
	st, err := fresh.Load(ctx, k)
	must(t, err)
	next := fence.Token{Era: st.Token.Era, Epoch: 6}
	got, err := fresh.Claim(ctx, k, next, "m2")
	must(t, err)
	if got.Position != 10 {
		t.Fatalf("the next owner's claim on b resumes after %d, want 10", got.Position)
	}
	must(t, write(fresh, next, "v11"))
	if v := readKV(t, stores["b"], "device-1"); v != "v11" {
		t.Fatalf("b holds device-1 = %q, want v11", v)
	}
}

// crashingPublish is a placement store whose Publish fails while crash is set: a move
// interrupted after its copy, before its publication.
type crashingPublish struct {
	Placements
	crash bool
}

func (c *crashingPublish) Publish(ctx context.Context, p Placement, reason string) error {
	if c.crash {
		return errors.New("crashed before publishing")
	}
	return c.Placements.Publish(ctx, p, reason)
}

// A move interrupted after any of its steps leaves k retired on a and placement 1 in force;
// Move run again finishes it, copying the partition once. A copy that fails commits nothing on
// b, and is run again.
func TestMoveResumesAfterAnInterruption(t *testing.T) {
	for _, stop := range []string{"retired", "seeded", "copy failed", "copied"} {
		t.Run(stop, func(t *testing.T) {
			shards, stores, pl := liteShards(t, names3...)
			crashing := &crashingPublish{Placements: pl}
			r := newRouter(t, shards, crashing)
			ctx := t.Context()
			k := keyOn(t, r.Placement(), "g", "a")
			_, err := r.Claim(ctx, k, tok(0, 5), "m1")
			must(t, err)
			must(t, r.Apply(ctx, k, tok(0, 5), 0, 10, func(ctx context.Context, tx *sql.Tx) error {
				return writeLite(ctx, tx, "device-1", "v10")
			}))
			calls := 0
			switch stop {
			case "retired":
				must(t, r.Retire(ctx, k, 2, "move"))
			case "seeded":
				must(t, r.Retire(ctx, k, 2, "move"))
				st, err := stores["a"].Load(ctx, k)
				must(t, err)
				_, err = seed(ctx, shards["b"], k, st.Token, seededBy(2), "seed")
				must(t, err)
			case "copy failed":
				failing := func(ctx context.Context, k fence.Key, from string, tx *sql.Tx) error {
					if err := writeLite(ctx, tx, "device-1", "half"); err != nil {
						return err
					}
					return errors.New("copy interrupted")
				}
				if err := r.Move(ctx, k, "b", failing); err == nil {
					t.Fatal("Move with a failing copy succeeded")
				}
				if v := readKV(t, stores["b"], "device-1"); v != "" {
					t.Fatalf("b holds device-1 = %q after a failed copy, want nothing", v)
				}
			case "copied":
				crashing.crash = true
				if err := r.Move(ctx, k, "b", copyKV(stores, &calls)); err == nil {
					t.Fatal("Move with a failing publication succeeded")
				}
				crashing.crash = false
			}
			if v := r.Placement().Version; v != 1 {
				t.Fatalf("placement in force after the interruption = %d, want 1", v)
			}
			_, err = r.Claim(ctx, k, tok(0, 6), "m2")
			wantIs(t, "a claim on a after the interruption", err, ErrMoved)
			must(t, r.Move(ctx, k, "b", copyKV(stores, &calls)))
			if calls != 1 {
				t.Fatalf("the partition was copied %d times, want once", calls)
			}
			if got := r.Placement(); got.Version != 2 || got.Shard(k) != "b" {
				t.Fatalf("placement after the resumed move = %d with %s on %s, want 2 and b", got.Version, k, got.Shard(k))
			}
			st, err := stores["b"].Load(ctx, k)
			must(t, err)
			if st.Position != 10 || readKV(t, stores["b"], "device-1") != "v10" {
				t.Fatalf("b after the resumed move: fence %+v, device-1 = %q; want position 10 and v10", st, readKV(t, stores["b"], "device-1"))
			}
			must(t, r.Move(ctx, k, "b", copyKV(stores, &calls))) // done: nothing to do
			if calls != 1 || r.Placement().Version != 2 {
				t.Fatalf("a repeated Move copied again or published again")
			}
		})
	}
}

// A key moved away and back climbs above every token of both shards' histories; a key that
// never applied moves with its fence alone, and the copy is not called.
func TestMoveAwayAndBack(t *testing.T) {
	shards, stores, pl := liteShards(t, names3...)
	r := newRouter(t, shards, pl)
	ctx := t.Context()
	k := keyOn(t, r.Placement(), "g", "a")
	calls := 0
	must(t, r.Move(ctx, k, "b", copyKV(stores, &calls)))
	if calls != 0 {
		t.Fatalf("the copy of a partition that applied nothing ran %d times", calls)
	}
	st, err := r.Load(ctx, k)
	must(t, err)
	tk := fence.Token{Era: st.Token.Era, Epoch: 3}
	_, err = r.Claim(ctx, k, tk, "m1")
	must(t, err)
	must(t, r.Apply(ctx, k, tk, 0, 4, func(ctx context.Context, tx *sql.Tx) error {
		return writeLite(ctx, tx, "device-1", "on-b")
	}))
	must(t, r.Move(ctx, k, "a", copyKV(stores, &calls)))
	if calls != 1 || readKV(t, stores["a"], "device-1") != "on-b" {
		t.Fatalf("moving back: %d copies, a holds %q; want 1 and on-b", calls, readKV(t, stores["a"], "device-1"))
	}
	_, err = r.Claim(ctx, k, tk, "m1")
	wantIs(t, "the claim of b's owner on a", err, fence.ErrStale)
	wantIs(t, "the write of b's owner on a", r.Apply(ctx, k, tk, 5, 5, func(context.Context, *sql.Tx) error { return nil }), fence.ErrStale)
	if got := r.Placement(); got.Version != 3 || got.Shard(k) != "a" {
		t.Fatalf("placement = %d with %s on %s, want 3 and a", got.Version, k, got.Shard(k))
	}
	h, err := pl.History(ctx)
	must(t, err)
	if len(h) != 3 || h[1].Reason != "move "+k.String()+" from shard a to shard b (placement 2): publish" || h[2].Placement.Shard(k) != "a" || h[2].At.IsZero() {
		t.Fatalf("history = %+v, want placements 1 to 3, each move's reason naming the key and shards", h)
	}
}
