package shard

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/sqliteoutbox"
)

// copyTables returns a copy function that copies every row of the named tables from shard
// from's database into the new shard's transaction (INSERT OR REPLACE: a row of the same key
// there is overwritten), counting its calls. The tests keep one partition's rows per database.
func copyTables(stores map[string]*sql.DB, calls *int, tables ...string) func(ctx context.Context, k fence.Key, from string, tx *sql.Tx) error {
	return func(ctx context.Context, k fence.Key, from string, tx *sql.Tx) error {
		*calls++
		for _, table := range tables {
			rows, err := stores[from].QueryContext(ctx, `SELECT * FROM `+table)
			if err != nil {
				return err
			}
			cols, err := rows.Columns()
			if err != nil {
				rows.Close()
				return err
			}
			insert := fmt.Sprintf(`INSERT OR REPLACE INTO %s VALUES (%s)`, table, strings.TrimSuffix(strings.Repeat("?,", len(cols)), ","))
			// The copy contract: the destination's rows of the partition (here every row of
			// the table) become the source's, so rows left from an earlier stay go first.
			if _, err := tx.ExecContext(ctx, `DELETE FROM `+table); err != nil {
				rows.Close()
				return err
			}
			var all [][]any
			for rows.Next() {
				vals := make([]any, len(cols))
				ptrs := make([]any, len(cols))
				for i := range vals {
					ptrs[i] = &vals[i]
				}
				if err := rows.Scan(ptrs...); err != nil {
					rows.Close()
					return err
				}
				all = append(all, vals)
			}
			err = rows.Err()
			rows.Close()
			if err != nil {
				return err
			}
			for _, vals := range all {
				if _, err := tx.ExecContext(ctx, insert, vals...); err != nil {
					return err
				}
			}
		}
		return nil
	}
}

// liteDBs returns the *sql.DB of each SQLite shard.
func liteDBs(stores map[string]*sqlitefence.Store) map[string]*sql.DB {
	dbs := map[string]*sql.DB{}
	for n, s := range stores {
		dbs[n] = s.DB()
	}
	return dbs
}

// applyHook is a shard whose Apply runs before once, before the store's Apply begins: what
// another process does between a move's seed and its copy.
type applyHook struct {
	Shard[*sql.Tx]
	before func()
}

func (h *applyHook) Apply(ctx context.Context, k fence.Key, t fence.Token, first, last int64, fn func(ctx context.Context, tx *sql.Tx) error) error {
	if h.before != nil {
		before := h.before
		h.before = nil
		before()
	}
	return h.Shard.Apply(ctx, k, t, first, last, fn)
}

// resetHook is a shard whose ResetTopic runs after once the store's reset committed: what
// another process does between a shard's reset and the router's retiring again.
type resetHook struct {
	Shard[*sql.Tx]
	after func()
}

func (h *resetHook) ResetTopic(ctx context.Context, group, topic string, expected, to fence.Topic, reason string) error {
	err := h.Shard.ResetTopic(ctx, group, topic, expected, to, reason)
	if err == nil && h.after != nil {
		after := h.after
		h.after = nil
		after()
	}
	return err
}

// publishHook is a placement store whose Publish runs before once, just before it stores:
// what another process does between the router's checks of a move and the placement's store.
type publishHook struct {
	Placements
	before func()
}

func (p *publishHook) Publish(ctx context.Context, next Placement, reason string) error {
	if p.before != nil {
		before := p.before
		p.before = nil
		before()
	}
	return p.Placements.Publish(ctx, next, reason)
}

// k moves a→b (placement 2), b's owner applies, then k moves back b→a (placement 3). The seed
// un-retires a's fence, at (e, 0), before the placement that puts k on a again is stored. A
// member still routing by placement 1 (its home shard unreachable since before placement 2),
// which puts k on a, claims there at (e, its generation), above the seed, and writes k on a
// from a's old position, while placement 2, in force, has k on b and b's owner writes there.
func TestMoveBackRefusesOldPlacementClaimsBetweenSeedAndCopy(t *testing.T) {
	shards, stores, pl := liteShards(t, names3...)
	home := &unreachable{Placements: pl}
	zombie := newRouter(t, shards, home)
	hooked := &applyHook{Shard: shards["a"]}
	operator := newRouter(t, map[string]Shard[*sql.Tx]{"a": hooked, "b": shards["b"], "c": shards["c"]}, pl)
	ctx := t.Context()
	k := keyOn(t, operator.Placement(), "g", "a")
	_, err := zombie.Claim(ctx, k, tok(0, 5), "m1")
	must(t, err)
	must(t, zombie.Apply(ctx, k, tok(0, 5), 0, 10, func(ctx context.Context, tx *sql.Tx) error {
		return writeLite(ctx, tx, "device-1", "v10")
	}))
	home.down = true // the zombie keeps placement 1: k on a
	calls := 0
	must(t, operator.Move(ctx, k, "b", copyKV(stores, &calls)))
	st, err := operator.Load(ctx, k)
	must(t, err)
	onB := fence.Token{Era: st.Token.Era, Epoch: 6}
	_, err = operator.Claim(ctx, k, onB, "m2")
	must(t, err)
	must(t, operator.Apply(ctx, k, onB, 11, 20, func(ctx context.Context, tx *sql.Tx) error {
		return writeLite(ctx, tx, "device-1", "v20")
	}))
	var claimErr, writeErr error
	var zt fence.Token
	hooked.before = func() {
		// Like a consumer: a refused claim is started afresh from a new Load, and a member
		// whose claim is stale recovers.
		for range 2 {
			st, err := zombie.Load(ctx, k)
			if err != nil {
				claimErr = err
				return
			}
			zt = fence.Token{Era: st.Token.Era, Epoch: 5}
			if _, claimErr = zombie.Claim(ctx, k, zt, "m1"); claimErr == nil {
				break
			}
			if rt, err := zombie.Recover(ctx, k, st.Token, 5, "m1", "recovery after a stale claim"); err == nil {
				zt, claimErr = rt, nil
				break
			}
		}
		if claimErr != nil {
			return
		}
		writeErr = zombie.Apply(ctx, k, zt, 11, 11, func(ctx context.Context, tx *sql.Tx) error {
			return writeLite(ctx, tx, "device-1", "zombie")
		})
	}
	moveErr := operator.Move(ctx, k, "a", copyKV(stores, &calls))
	if claimErr == nil {
		t.Fatalf("during the move back, placement 1's member claimed %s on a at %s (placement %d in force puts it on b): its write: %v, a holds %q; the move: %v",
			k, zt, operator.Placement().Version, writeErr, readKV(t, stores["a"], "device-1"), moveErr)
	}
	wantIs(t, "placement 1's claim on a during the move back", claimErr, ErrMoved)
}

// A topic reset moves a retired fence to a new era without a claimant; the router retires it
// again afterwards, but only if nobody claimed it in between ("claimed, so never reset"). A
// member routing by the placement before the move (its home shard unreachable) claims k on
// its old shard in that window, and then writes there while k lives on another shard.
func TestTopicResetLeavesNoWindowToClaimAMovedKeysOldFence(t *testing.T) {
	shards, stores, pl := liteShards(t, names3...)
	home := &unreachable{Placements: pl}
	zombie := newRouter(t, shards, home)
	hooked := &resetHook{Shard: shards["b"]}
	opShards := map[string]Shard[*sql.Tx]{"a": shards["a"], "b": hooked, "c": shards["c"]}
	operator := newRouter(t, opShards, pl)
	ctx := t.Context()
	idA, idB := fence.Topic{ID: "idA", Partitions: 64}, fence.Topic{ID: "idB", Partitions: 64}
	_, _, err := operator.SeeTopic(ctx, "g", "t", idA, "first claim")
	must(t, err)
	k := keyOn(t, operator.Placement(), "g", "b")
	_, err = zombie.Claim(ctx, k, tok(0, 5), "m1")
	must(t, err)
	must(t, zombie.Apply(ctx, k, tok(0, 5), 0, 10, func(ctx context.Context, tx *sql.Tx) error {
		return writeLite(ctx, tx, "device-1", "v10")
	}))
	calls := 0
	must(t, operator.Move(ctx, k, "c", copyKV(stores, &calls)))
	home.down = true // the zombie keeps placement 1: k on b
	var zt fence.Token
	var claimErr error
	hooked.after = func() {
		st, err := zombie.Load(ctx, k)
		if err != nil {
			claimErr = err
			return
		}
		zt = fence.Token{Era: st.Token.Era, Epoch: 7}
		_, claimErr = zombie.Claim(ctx, k, zt, "m1")
	}
	must(t, operator.ResetTopic(ctx, "g", "t", idA, idB, "recreated"))
	if claimErr == nil {
		err := zombie.Apply(ctx, k, zt, 0, 0, func(ctx context.Context, tx *sql.Tx) error {
			return writeLite(ctx, tx, "device-1", "zombie")
		})
		if err == nil {
			t.Fatalf("the old placement's member claimed %s on b at %s during the reset and committed a write there (b holds %q) while placement %d puts %s on c",
				k, zt, readKV(t, stores["b"], "device-1"), operator.Placement().Version, k)
		}
	}
	st, err := stores["b"].Load(ctx, k)
	must(t, err)
	if !retired(st.Claimant) {
		t.Fatalf("fence of %s on b after the reset = %+v, want retired (the zombie's claim: %v)", k, st, claimErr)
	}
}

// Publish checks that the old fence is retired, then stores the placement: a topic reset
// between the two un-retires the old fence, and its re-retirement reads the placement still in
// force, which does not move k yet, so it leaves k's old fence unclaimed in a new era. Once the
// placement is stored nothing retires it: a member of the old placement claims and writes k on
// the shard k left.
func TestPublishRacingATopicResetLeavesTheOldFenceRetired(t *testing.T) {
	shards, stores, pl := liteShards(t, names3...)
	home := &unreachable{Placements: pl}
	zombie := newRouter(t, shards, home)
	resetter := newRouter(t, shards, pl)
	hooked := &publishHook{Placements: pl}
	operator := newRouter(t, shards, hooked)
	ctx := t.Context()
	idA, idB := fence.Topic{ID: "idA", Partitions: 64}, fence.Topic{ID: "idB", Partitions: 64}
	_, _, err := operator.SeeTopic(ctx, "g", "t", idA, "first claim")
	must(t, err)
	k := keyOn(t, operator.Placement(), "g", "b")
	_, err = zombie.Claim(ctx, k, tok(0, 5), "m1")
	must(t, err)
	must(t, zombie.Apply(ctx, k, tok(0, 5), 0, 10, func(ctx context.Context, tx *sql.Tx) error {
		return writeLite(ctx, tx, "device-1", "v10")
	}))
	hooked.before = func() {
		must(t, resetter.ResetTopic(ctx, "g", "t", idA, idB, "recreated"))
	}
	calls := 0
	must(t, operator.Move(ctx, k, "c", copyKV(stores, &calls)))
	home.down = true // the zombie keeps placement 1: k on b
	st, err := stores["b"].Load(ctx, k)
	must(t, err)
	if retired(st.Claimant) {
		return
	}
	zt := fence.Token{Era: st.Token.Era, Epoch: 7}
	_, cerr := zombie.Claim(ctx, k, zt, "m1")
	var aerr error
	if cerr == nil {
		aerr = zombie.Apply(ctx, k, zt, 0, 0, func(ctx context.Context, tx *sql.Tx) error {
			return writeLite(ctx, tx, "device-1", "zombie")
		})
	}
	t.Fatalf("placement %d puts %s on c, but its fence on b is %+v, not retired: the old placement's claim at %s: %v, its write: %v (b holds %q)",
		operator.Placement().Version, k, st, zt, cerr, aerr, readKV(t, stores["b"], "device-1"))
}

// A recreated topic's reset leaves every fence of the topic at position -1 (its offsets start
// again), but the application's rows of the partition stay in the shard's database: no
// position says the copy has anything to carry, nor, after it, that it was made. Move refuses
// such a key before it retires anything (the partition keeps applying where it is) and moves
// it after its next batch, with its rows.
func TestMoveAfterTopicResetWaitsForABatchThenCopiesTheRows(t *testing.T) {
	shards, stores, pl := liteShards(t, names3...)
	r := newRouter(t, shards, pl)
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
	must(t, r.ResetTopic(ctx, "g", "t", idA, idB, "recreated"))
	calls := 0
	if err := r.Move(ctx, k, "b", copyKV(stores, &calls)); !errors.Is(err, fence.ErrConflict) || calls != 0 {
		t.Fatalf("moving %s past a topic reset before its next batch: %v after %d copies, want ErrConflict before any copy", k, err, calls)
	}
	st, err := r.Load(ctx, k)
	must(t, err)
	if retired(st.Claimant) {
		t.Fatalf("the refused move left %s retired on a: %+v", k, st)
	}
	next := fence.Token{Era: st.Token.Era, Epoch: 6}
	_, err = r.Claim(ctx, k, next, "m1")
	must(t, err)
	must(t, r.Apply(ctx, k, next, 0, 0, func(ctx context.Context, tx *sql.Tx) error {
		return writeLite(ctx, tx, "device-2", "v0")
	}))
	must(t, r.Move(ctx, k, "b", copyKV(stores, &calls)))
	if got := readKV(t, stores["b"], "device-1"); calls != 1 || got != "v10" {
		t.Fatalf("after moving %s to b past a topic reset and a batch: %d copies, b holds device-1 = %q; want 1 copy and the row a held, v10", k, calls, got)
	}
}

// A key that moves a→b and back b→a with no batch applied on b has the same position on both
// shards, so no position says what the move back must copy; yet b's owner relayed, under b's
// fence, the outbox rows copied from a: b's cursor marks them delivered, a's still says
// pending. Skipping the copy would have a's next owner publish them again (an unbounded
// backlog, not the at most one batch a crash re-publishes). Move refuses it until b applies a
// batch, then copies, marks included.
func TestMoveBackWaitsForABatchAndKeepsTheDeliveredMarks(t *testing.T) {
	shards, stores, pl := liteShards(t, names3...)
	r := newRouter(t, shards, pl)
	ctx := t.Context()
	boxes := map[string]*sqliteoutbox.Store{}
	for _, n := range names3 {
		box, err := sqliteoutbox.New(stores[n])
		must(t, err)
		must(t, box.Migrate(ctx))
		boxes[n] = box
	}
	k := keyOn(t, r.Placement(), "g", "a")
	_, err := r.Claim(ctx, k, tok(0, 5), "m1")
	must(t, err)
	must(t, r.Apply(ctx, k, tok(0, 5), 0, 10, func(ctx context.Context, tx *sql.Tx) error {
		if err := writeLite(ctx, tx, "device-1", "v10"); err != nil {
			return err
		}
		return boxes["a"].Append(ctx, tx, k, tok(0, 5), outbox.Message{Topic: "commands", Value: []byte("m-1")})
	}))
	calls := 0
	cp := copyTables(liteDBs(stores), &calls, "kv", "baton_outbox", "baton_outbox_cursors")
	must(t, r.Move(ctx, k, "b", cp))
	// b's owner relays the copied row and marks it delivered, then the key moves back.
	st, err := r.Load(ctx, k)
	must(t, err)
	onB := fence.Token{Era: st.Token.Era, Epoch: 6}
	_, err = r.Claim(ctx, k, onB, "m2")
	must(t, err)
	rows, err := boxes["b"].Pending(ctx, k, onB, 10)
	must(t, err)
	if len(rows) != 1 {
		t.Fatalf("b's owner finds %d pending rows after the move, want the 1 copied from a", len(rows))
	}
	_, err = boxes["b"].MarkDelivered(ctx, k, onB, rows[0].Seq)
	must(t, err)
	before := calls
	if err := r.Move(ctx, k, "a", cp); !errors.Is(err, fence.ErrConflict) || calls != before {
		t.Fatalf("moving %s back to a with no batch on b: %v after %d copies, want ErrConflict before any copy", k, err, calls-before)
	}
	must(t, r.Apply(ctx, k, onB, 11, 11, func(ctx context.Context, tx *sql.Tx) error {
		return writeLite(ctx, tx, "device-1", "v11")
	}))
	must(t, r.Move(ctx, k, "a", cp))
	st, err = r.Load(ctx, k)
	must(t, err)
	onA := fence.Token{Era: st.Token.Era, Epoch: 7}
	_, err = r.Claim(ctx, k, onA, "m3")
	must(t, err)
	rows, err = boxes["a"].Pending(ctx, k, onA, 10)
	must(t, err)
	if len(rows) != 0 {
		t.Fatalf("a's next owner finds %d pending rows (seq %d) that b already delivered, want none (copies: %d)", len(rows), rows[0].Seq, calls)
	}
}

// The inbox's admissions are keyed-fence rows in the receiving partition's shard, stored by the
// fence store, not by the application, and the fence API cannot list them: Move's copy
// contract names them, and a copy that carries them too (here the fence store's keyed table,
// every row of which is the receiving partition's) keeps a re-published copy of a record the
// receiver applied on a from being admitted again on b.
func TestMoveOfAReceiverPartitionKeepsItsAdmissions(t *testing.T) {
	shards, stores, pl := liteShards(t, names3...)
	r := newRouter(t, shards, pl)
	ctx := t.Context()
	for _, n := range names3 {
		box, err := sqliteoutbox.New(stores[n])
		must(t, err)
		must(t, box.Migrate(ctx))
	}
	k := keyOn(t, r.Placement(), "g", "a")
	const scope = "billing|src/events/0|t/1"
	admit := func(tk fence.Token, pos int64) fence.Verdict {
		t.Helper()
		var v fence.Verdict
		must(t, r.Apply(ctx, k, tk, pos, pos, func(ctx context.Context, tx *sql.Tx) error {
			var err error
			v, err = r.Admit(ctx, tx, scope, "key-1", tok(3, 2), 7)
			if err != nil || v != fence.Admitted {
				return err
			}
			return writeLite(ctx, tx, "balance", "charged once")
		}))
		return v
	}
	_, err := r.Claim(ctx, k, tok(0, 5), "m1")
	must(t, err)
	if v := admit(tok(0, 5), 0); v != fence.Admitted {
		t.Fatalf("first admission on a: %v", v)
	}
	calls := 0
	must(t, r.Move(ctx, k, "b", copyTables(liteDBs(stores), &calls, "kv", "baton_outbox", "baton_outbox_cursors", "baton_fences_keyed")))
	st, err := r.Load(ctx, k)
	must(t, err)
	onB := fence.Token{Era: st.Token.Era, Epoch: 6}
	_, err = r.Claim(ctx, k, onB, "m2")
	must(t, err)
	if v := admit(onB, 1); v != fence.Duplicate {
		t.Fatalf("a re-published copy of the record applied on a is %v on b after the move, want %v", v, fence.Duplicate)
	}
}

// An operator who gives up an interrupted move (k retired on a for placement 2, placement 1 in
// force) by moving k to the shard it lives on gets success, but k stays retired there: its
// partition waits for a publication that never comes.
func TestMoveToItsOwnShardAfterAnInterruptedMoveLeavesTheKeyLive(t *testing.T) {
	shards, _, pl := liteShards(t, names3...)
	r := newRouter(t, shards, pl)
	ctx := t.Context()
	k := keyOn(t, r.Placement(), "g", "a")
	_, err := r.Claim(ctx, k, tok(0, 5), "m1")
	must(t, err)
	must(t, r.Retire(ctx, k, 2, "move to b, interrupted"))
	if err := r.Move(ctx, k, "a", nil); err != nil {
		return // refused: the operator knows the move is still under way
	}
	st, err := r.Load(ctx, k)
	must(t, err)
	_, err = r.Claim(ctx, k, fence.Token{Era: st.Token.Era, Epoch: 6}, "m2")
	if err != nil {
		t.Fatalf("Move of %s to a, where placement %d puts it, succeeded, but the next owner's claim there fails: %v", k, r.Placement().Version, err)
	}
}

// Two operators move two keys at once: both retire for placement 2, one publishes it, and the
// other's publication is refused. The second key is then retired on its shard for a placement
// that does not move it: its partition waits until someone runs its Move again, and Move
// reports a conflict instead of finishing on the next version.
func TestConcurrentMovesOfTwoKeysBothFinish(t *testing.T) {
	shards, _, pl := liteShards(t, names3...)
	op1 := newRouter(t, shards, pl)
	op2 := newRouter(t, shards, pl)
	ctx := t.Context()
	k1 := keyOn(t, op1.Placement(), "g", "a")
	k2 := keyOn(t, op1.Placement(), "h", "a")
	_, err := op2.Claim(ctx, k2, tok(0, 5), "m1")
	must(t, err)
	must(t, op2.Apply(ctx, k2, tok(0, 5), 0, 10, func(context.Context, *sql.Tx) error { return nil }))
	copyRunsOtherMove := func(ctx context.Context, k fence.Key, from string, tx *sql.Tx) error {
		return op1.Move(ctx, k1, "b", nil)
	}
	err = op2.Move(ctx, k2, "c", copyRunsOtherMove)
	p := op2.Placement() // op1 routes by placement 2 until its next claim re-reads it
	if err != nil || p.Shard(k1) != "b" || p.Shard(k2) != "c" {
		st, lerr := shards["a"].Load(ctx, k2)
		t.Fatalf("concurrent moves: second Move: %v; placement %d puts %s on %s and %s on %s, want b and c (%s's fence on a: %+v %v)",
			err, p.Version, k1, p.Shard(k1), k2, p.Shard(k2), k2, st, lerr)
	}
}

// flakyAfterReset is a shard whose first ResetTopic commits and then fails: a transient error
// (a dropped connection) after the shard's reset committed.
type flakyAfterReset struct {
	Shard[*sql.Tx]
	failed bool
}

func (f *flakyAfterReset) ResetTopic(ctx context.Context, group, topic string, expected, to fence.Topic, reason string) error {
	err := f.Shard.ResetTopic(ctx, group, topic, expected, to, reason)
	if err == nil && !f.failed {
		f.failed = true
		return errors.New("connection reset")
	}
	return err
}

// ResetTopic is documented to be completed by calling it again after a shard's failure. A
// failure after a shard's reset committed leaves the shard at the new identity, and the next
// call skips a shard already at it: k's fence on the shard it left must be retired still,
// by the shard's own reset, not by a step after it that the next call skips.
func TestTopicResetCalledAgainRetiresAMovedKeysOldFence(t *testing.T) {
	shards, _, pl := liteShards(t, names3...)
	flaky := &flakyAfterReset{Shard: shards["b"]}
	r := newRouter(t, map[string]Shard[*sql.Tx]{"a": shards["a"], "b": flaky, "c": shards["c"]}, pl)
	ctx := t.Context()
	idA, idB := fence.Topic{ID: "idA", Partitions: 64}, fence.Topic{ID: "idB", Partitions: 64}
	_, _, err := r.SeeTopic(ctx, "g", "t", idA, "first claim")
	must(t, err)
	k := keyOn(t, r.Placement(), "g", "b")
	_, err = r.Claim(ctx, k, tok(0, 5), "m1")
	must(t, err)
	move(t, r, k, "c")
	if err := r.ResetTopic(ctx, "g", "t", idA, idB, "recreated"); err == nil {
		t.Fatal("the reset with a failing load succeeded")
	}
	must(t, r.ResetTopic(ctx, "g", "t", idA, idB, "recreated, again"))
	st, err := shards["b"].Load(ctx, k)
	must(t, err)
	if !retired(st.Claimant) {
		t.Fatalf("after the reset completed by a second call, %s's fence on b (placement %d puts it on c) is %+v, want retired", k, r.Placement().Version, st)
	}
}

// Move leaves a key's rows on the shard it leaves ("a key that comes back finds them there")
// and its documented copy writes what the old shard holds into the new shard's transaction.
// A key that moves a→b, deletes a row on b and moves back finds the row it deleted on a
// again: the copy writes b's rows, and nothing removes a's stale ones.
func TestMoveBackDoesNotResurrectRowsDeletedMeanwhile(t *testing.T) {
	shards, stores, pl := liteShards(t, names3...)
	r := newRouter(t, shards, pl)
	ctx := t.Context()
	k := keyOn(t, r.Placement(), "g", "a")
	_, err := r.Claim(ctx, k, tok(0, 5), "m1")
	must(t, err)
	must(t, r.Apply(ctx, k, tok(0, 5), 0, 10, func(ctx context.Context, tx *sql.Tx) error {
		return writeLite(ctx, tx, "device-1", "v10")
	}))
	calls := 0
	must(t, r.Move(ctx, k, "b", copyKV(stores, &calls)))
	st, err := r.Load(ctx, k)
	must(t, err)
	onB := fence.Token{Era: st.Token.Era, Epoch: 6}
	_, err = r.Claim(ctx, k, onB, "m2")
	must(t, err)
	must(t, r.Apply(ctx, k, onB, 11, 11, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM kv WHERE k = 'device-1'`)
		return err
	}))
	must(t, r.Move(ctx, k, "a", copyKV(stores, &calls)))
	if got := readKV(t, stores["a"], "device-1"); got != "" {
		t.Fatalf("after moving back, a holds device-1 = %q, deleted on b at record 11 (copies: %d)", got, calls)
	}
}

// A move back interrupted after its seed (k's fence on a held by the seed's claimant, the
// placement putting k on a not stored) and a topic reset then: the reset moves the seeded
// fence, whose epoch is 0 (not sealed), to a new era without a claimant, so the router no
// longer recognizes it as the seed's, and a member routing by the placement before the first
// move (k on a) claims it and writes on a while the placement in force puts k on b.
func TestMoveBackInterruptedAfterItsSeedThenATopicResetRefusesOldPlacementClaims(t *testing.T) {
	shards, stores, pl := liteShards(t, names3...)
	home := &unreachable{Placements: pl}
	zombie := newRouter(t, shards, home)
	crashing := &crashingPublish{Placements: pl}
	operator := newRouter(t, shards, crashing)
	ctx := t.Context()
	idA, idB := fence.Topic{ID: "idA", Partitions: 64}, fence.Topic{ID: "idB", Partitions: 64}
	_, _, err := operator.SeeTopic(ctx, "g", "t", idA, "first claim")
	must(t, err)
	k := keyOn(t, operator.Placement(), "g", "a")
	_, err = zombie.Claim(ctx, k, tok(0, 5), "m1")
	must(t, err)
	must(t, zombie.Apply(ctx, k, tok(0, 5), 0, 10, func(ctx context.Context, tx *sql.Tx) error {
		return writeLite(ctx, tx, "device-1", "v10")
	}))
	home.down = true // the zombie keeps placement 1: k on a
	calls := 0
	must(t, operator.Move(ctx, k, "b", copyKV(stores, &calls)))
	st, err := operator.Load(ctx, k)
	must(t, err)
	onB := fence.Token{Era: st.Token.Era, Epoch: 6}
	_, err = operator.Claim(ctx, k, onB, "m2")
	must(t, err)
	must(t, operator.Apply(ctx, k, onB, 11, 20, func(ctx context.Context, tx *sql.Tx) error {
		return writeLite(ctx, tx, "device-1", "v20")
	}))
	crashing.crash = true
	if err := operator.Move(ctx, k, "a", copyKV(stores, &calls)); err == nil {
		t.Fatal("the move back with a failing publication succeeded")
	}
	crashing.crash = false
	must(t, operator.ResetTopic(ctx, "g", "t", idA, idB, "recreated"))
	st, err = zombie.Load(ctx, k)
	must(t, err)
	zt := fence.Token{Era: st.Token.Era, Epoch: 5}
	if _, err := zombie.Claim(ctx, k, zt, "m1"); err == nil {
		werr := zombie.Apply(ctx, k, zt, 0, 0, func(ctx context.Context, tx *sql.Tx) error {
			return writeLite(ctx, tx, "device-1", "zombie")
		})
		t.Fatalf("after a topic reset during the interrupted move back, placement 1's member claimed %s on a at %s (placement %d in force puts it on b); its write: %v, a holds %q",
			k, zt, operator.Placement().Version, werr, readKV(t, stores["a"], "device-1"))
	}
}
