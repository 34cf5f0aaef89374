package shard

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/batonhq/baton/fence"
)

// pgApplyHook is applyHook for PostgreSQL shards.
type pgApplyHook struct {
	Shard[pgx.Tx]
	before func()
}

func (h *pgApplyHook) Apply(ctx context.Context, k fence.Key, t fence.Token, first, last int64, fn func(ctx context.Context, tx pgx.Tx) error) error {
	if h.before != nil {
		before := h.before
		h.before = nil
		before()
	}
	return h.Shard.Apply(ctx, k, t, first, last, fn)
}

// copyKVPG copies shard from's kv rows into the new shard's transaction.
func copyKVPG(pools map[string]*pgxpool.Pool) func(ctx context.Context, k fence.Key, from string, tx pgx.Tx) error {
	return func(ctx context.Context, k fence.Key, from string, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM kv`); err != nil { // the copy contract: delete first
			return err
		}
		rows, err := pools[from].Query(ctx, `SELECT k, v FROM kv`)
		if err != nil {
			return err
		}
		var key, v string
		var kvs [][2]string
		if _, err := pgx.ForEachRow(rows, []any{&key, &v}, func() error {
			kvs = append(kvs, [2]string{key, v})
			return nil
		}); err != nil {
			return err
		}
		for _, kv := range kvs {
			if err := writePG(ctx, tx, kv[0], kv[1]); err != nil {
				return err
			}
		}
		return nil
	}
}

func readKVPG(t *testing.T, pool *pgxpool.Pool, key string) string {
	t.Helper()
	var v string
	err := pool.QueryRow(t.Context(), `SELECT v FROM kv WHERE k = $1`, key).Scan(&v)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	return v
}

// TestMoveBackRefusesOldPlacementClaimsBetweenSeedAndCopy on PostgreSQL shards (one cluster
// each with BATON_POSTGRES_SHARD_URLS): the move back's seed un-retires a's fence before the
// placement putting k on a is stored, and placement 1's member claims and writes k there.
func TestMoveBackRefusesOldPlacementClaimsBetweenSeedAndCopyPostgres(t *testing.T) {
	shards, pools, pl := pgShards(t, names3...)
	home := &unreachable{Placements: pl}
	zombie := newRouter(t, shards, home)
	hooked := &pgApplyHook{Shard: shards["a"]}
	operator := newRouter(t, map[string]Shard[pgx.Tx]{"a": hooked, "b": shards["b"], "c": shards["c"]}, pl)
	ctx := t.Context()
	k := keyOn(t, operator.Placement(), "g", "a")
	_, err := zombie.Claim(ctx, k, tok(0, 5), "m1")
	must(t, err)
	must(t, zombie.Apply(ctx, k, tok(0, 5), 0, 10, func(ctx context.Context, tx pgx.Tx) error {
		return writePG(ctx, tx, "device-1", "v10")
	}))
	home.down = true // the zombie keeps placement 1: k on a
	must(t, operator.Move(ctx, k, "b", copyKVPG(pools)))
	st, err := operator.Load(ctx, k)
	must(t, err)
	onB := fence.Token{Era: st.Token.Era, Epoch: 6}
	_, err = operator.Claim(ctx, k, onB, "m2")
	must(t, err)
	must(t, operator.Apply(ctx, k, onB, 11, 20, func(ctx context.Context, tx pgx.Tx) error {
		return writePG(ctx, tx, "device-1", "v20")
	}))
	var claimErr, writeErr error
	var zt fence.Token
	hooked.before = func() {
		st, err := zombie.Load(ctx, k)
		if err != nil {
			claimErr = err
			return
		}
		zt = fence.Token{Era: st.Token.Era, Epoch: 5}
		if _, claimErr = zombie.Claim(ctx, k, zt, "m1"); claimErr != nil {
			return
		}
		writeErr = zombie.Apply(ctx, k, zt, 11, 11, func(ctx context.Context, tx pgx.Tx) error {
			return writePG(ctx, tx, "device-1", "zombie")
		})
	}
	moveErr := operator.Move(ctx, k, "a", copyKVPG(pools))
	if claimErr == nil {
		t.Fatalf("during the move back, placement 1's member claimed %s on a at %s (placement %d in force puts it on b): its write: %v, a holds %q; the move: %v",
			k, zt, operator.Placement().Version, writeErr, readKVPG(t, pools["a"], "device-1"), moveErr)
	}
	wantIs(t, "placement 1's claim on a during the move back", claimErr, ErrMoved)
}

// A move racing a batch in flight on PostgreSQL: the retirement waits for the batch (it takes
// the fence row the batch holds), so the copy reads the batch's rows, and after the move the
// batch's owner writes on neither shard.
func TestMoveWaitsForABatchInFlightPostgres(t *testing.T) {
	shards, pools, pl := pgShards(t, names3...)
	home := &unreachable{Placements: pl}
	member := newRouter(t, shards, home)
	operator := newRouter(t, shards, pl)
	ctx := t.Context()
	k := keyOn(t, operator.Placement(), "g", "a")
	_, err := member.Claim(ctx, k, tok(0, 5), "m1")
	must(t, err)
	inBatch, release := make(chan struct{}), make(chan struct{})
	applied := make(chan error, 1)
	go func() {
		applied <- member.Apply(ctx, k, tok(0, 5), 0, 10, func(ctx context.Context, tx pgx.Tx) error {
			close(inBatch)
			<-release
			return writePG(ctx, tx, "in-flight", "v10")
		})
	}()
	<-inBatch
	moved := make(chan error, 1)
	go func() { moved <- operator.Move(ctx, k, "b", copyKVPG(pools)) }()
	select {
	case err := <-moved:
		close(release)
		<-applied
		t.Fatalf("Move returned (%v) while a batch of the key was in flight on a", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	must(t, <-applied)
	must(t, <-moved)
	if got := readKVPG(t, pools["b"], "in-flight"); got != "v10" {
		t.Fatalf("b holds in-flight = %q after the move, want the batch that committed before the retirement", got)
	}
	home.down = true
	for _, r := range []Router[pgx.Tx]{member, operator} {
		err := r.Apply(ctx, k, tok(0, 5), 11, 11, func(ctx context.Context, tx pgx.Tx) error {
			return writePG(ctx, tx, "in-flight", "zombie")
		})
		wantIs(t, "the batch owner's next write", err, fence.ErrStale)
	}
	for _, n := range []string{"a", "b"} {
		if got := readKVPG(t, pools[n], "in-flight"); got != "v10" {
			t.Fatalf("%s holds in-flight = %q, want v10", n, got)
		}
	}
}
