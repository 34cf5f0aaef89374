package redisfence

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/fencecheck"
)

// maxPairs bounds the field-value pairs of one HSet or XAdd (Lua's unpack has a stack limit).
const maxPairs = 1000

// maxIncrement bounds HIncrBy's increment, and the fields it counts, to 2^53-1: the script
// checks the result with Lua's numbers, which are exact that far.
const maxIncrement = 1<<53 - 1

// Tx is a transaction: commands queued in order, fence advances ([Store.Advance]) and keyed
// fence admissions ([Store.Admit]), run by one script at [Tx.Commit], all or nothing. Nothing
// is written before the commit; a command is not a read, so a handler reads (with the client)
// before it queues. A Tx is not safe for concurrent use. Errors in queued commands (a key
// with the store's prefix, an odd number of fields, ...) are returned by the commit.
type Tx struct {
	s        *Store
	id       string // names the transaction's holds
	done     bool
	err      error
	ops      []op
	holds    []string
	advanced map[string]int64     // fence key -> the last position this tx advances it to
	admits   map[string]*admitted // keyed fence key -> what this tx saw and will store
}

type op struct {
	code string
	keys []string // the keys, substituted by their indexes into KEYS
	args []string
	// for an advance
	k         fence.Key
	t         fence.Token
	first, to int64
}

type admitted struct {
	i                  int // index of its op
	found              bool
	stored, next       fence.Token
	storedSeq, nextSeq int64
	write              bool
}

// Begin starts a transaction for [Store.Advance] and [Store.Admit] in the caller's hands; it
// does no I/O. The caller ends it with Commit or Rollback.
func (s *Store) Begin() *Tx {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand does not fail (Go 1.24+)
	return &Tx{s: s, id: hex.EncodeToString(b[:]), advanced: map[string]int64{}, admits: map[string]*admitted{}}
}

func (tx *Tx) fail(err error) {
	if tx.err == nil {
		tx.err = err
	}
}

func (tx *Tx) userKey(key string) bool {
	switch {
	case key == "":
		tx.fail(fmt.Errorf("%w: empty key", fence.ErrInvalid))
	case strings.HasPrefix(key, tx.s.k.prefix):
		tx.fail(fmt.Errorf("%w: key %q starts with the store's prefix %q", fence.ErrInvalid, key, tx.s.k.prefix))
	default:
		return true
	}
	return false
}

func (tx *Tx) pairs(cmd, key string, fv []string) {
	switch {
	case len(fv) == 0 || len(fv)%2 != 0:
		tx.fail(fmt.Errorf("%w: %s %s: %d arguments, want field-value pairs", fence.ErrInvalid, cmd, key, len(fv)))
	case len(fv)/2 > maxPairs:
		tx.fail(fmt.Errorf("%w: %s %s: more than %d pairs", fence.ErrInvalid, cmd, key, maxPairs))
	case tx.userKey(key):
		tx.ops = append(tx.ops, op{code: strings.ToLower(cmd), keys: []string{key},
			args: append([]string{strconv.Itoa(len(fv) / 2)}, fv...)})
	}
}

// HSet queues HSET key field value [field value ...].
func (tx *Tx) HSet(key string, fieldValues ...string) { tx.pairs("HSET", key, fieldValues) }

// XAdd queues XADD key * field value [field value ...]: an entry with a server-assigned ID.
func (tx *Tx) XAdd(key string, fieldValues ...string) { tx.pairs("XADD", key, fieldValues) }

// HIncrBy queues HINCRBY key field n. The commit refuses it ([ErrCommand]) if the field is not
// an integer, or it or n or the result is beyond ±(2^53-1).
func (tx *Tx) HIncrBy(key, field string, n int64) {
	if n > maxIncrement || n < -maxIncrement {
		tx.fail(fmt.Errorf("%w: HINCRBY %s %s by %d: beyond 2^53-1", fence.ErrInvalid, key, field, n))
		return
	}
	if tx.userKey(key) {
		tx.ops = append(tx.ops, op{code: "hincrby", keys: []string{key}, args: []string{field, i64(n)}})
	}
}

// Set queues SET key value.
func (tx *Tx) Set(key, value string) {
	if tx.userKey(key) {
		tx.ops = append(tx.ops, op{code: "set", keys: []string{key}, args: []string{value}})
	}
}

// Del queues DEL key.
func (tx *Tx) Del(key string) {
	if tx.userKey(key) {
		tx.ops = append(tx.ops, op{code: "del", keys: []string{key}})
	}
}

// Expire queues PEXPIRE key with d, which must be at least a millisecond.
func (tx *Tx) Expire(key string, d time.Duration) {
	if d < time.Millisecond {
		tx.fail(fmt.Errorf("%w: EXPIRE %s in %s: at least 1ms", fence.ErrInvalid, key, d))
		return
	}
	if tx.userKey(key) {
		tx.ops = append(tx.ops, op{code: "pexpire", keys: []string{key}, args: []string{i64(d.Milliseconds())}})
	}
}

// take holds key for tx and returns the named fields it stores ("" for a missing one).
func (tx *Tx) take(ctx context.Context, key string, fields ...string) ([]string, error) {
	args := []any{tx.id, i64(holdTTL.Milliseconds())}
	for _, f := range fields {
		args = append(args, f)
	}
	tx.holds = append(tx.holds, hold(key))
	r, err := tx.s.run(ctx, holdScript, []string{key, hold(key)}, args...)
	if err != nil {
		return nil, err
	}
	if len(r) != len(fields)+1 {
		return nil, fmt.Errorf("redisfence: hold reply %q", r)
	}
	return r[1:], nil
}

// advance queues the check-and-advance of k's fence, ahead of the commands.
func (tx *Tx) advance(k fence.Key, t fence.Token, first, last int64) {
	fk := tx.s.k.fence(k)
	tx.advanced[fk] = last
	n := 0 // the advances come first, in the order they were made
	for n < len(tx.ops) && tx.ops[n].code == "adv" {
		n++
	}
	tx.ops = slices.Insert(tx.ops, n, op{
		code: "adv",
		keys: []string{fk, hold(fk), tx.s.k.partitions(k.Group, k.Topic)},
		args: []string{i64(t.Era), i64(t.Epoch), i64(first), i64(last), i64(int64(k.Partition))},
		k:    k, t: t, first: first, to: last,
	})
	for _, a := range tx.admits {
		if a.i >= n {
			a.i++
		}
	}
}

// Admit implements [fence.KeyedSink] in tx: it holds the keyed fence of (scope, id) for tx
// (other admissions of it wait until tx ends, or for at most ten seconds), judges (t, seq)
// against what it stores with fencecheck.CheckAdmit, and, if [fence.Admitted], queues storing
// it for the commit, which refuses the whole transaction (fence.ErrConflict) should the keyed
// fence have changed meanwhile.
func (s *Store) Admit(ctx context.Context, tx *Tx, scope, id string, t fence.Token, seq int64) (fence.Verdict, error) {
	if err := fencecheck.ValidateAdmit(scope, id, t, seq); err != nil {
		return 0, err
	}
	if tx == nil || tx.s != s || tx.done {
		return 0, fmt.Errorf("%w: a transaction of another store, ended, or none", fence.ErrInvalid)
	}
	if err := s.ready(ctx); err != nil {
		return 0, err
	}
	ek := s.k.admit(scope, id)
	a, ok := tx.admits[ek]
	if !ok {
		r, err := tx.take(ctx, ek, "era", "epoch", "seq")
		if err != nil {
			return 0, fmt.Errorf("redisfence: admit %s/%s: %w", scope, id, err)
		}
		a = &admitted{i: len(tx.ops), found: r[0] != ""}
		if a.found {
			var errs [3]error
			a.stored.Era, errs[0] = strconv.ParseInt(r[0], 10, 64)
			a.stored.Epoch, errs[1] = strconv.ParseInt(r[1], 10, 64)
			a.storedSeq, errs[2] = strconv.ParseInt(r[2], 10, 64)
			if err := errors.Join(errs[:]...); err != nil {
				return 0, fmt.Errorf("redisfence: keyed fence %s/%s: %w", scope, id, err)
			}
		}
		a.next, a.nextSeq = a.stored, a.storedSeq
		tx.admits[ek] = a
		tx.ops = append(tx.ops, op{code: "adm", keys: []string{ek, hold(ek)}})
	}
	v := fencecheck.CheckAdmit(a.next, a.nextSeq, a.found || a.write, t, seq)
	if v == fence.Admitted {
		a.next, a.nextSeq, a.write = t, seq, true
	}
	return v, nil
}

// Commit runs tx's operations in one script: every fence advance and admission is checked and
// every command is checked against the keys as the earlier ones leave them; if one fails,
// nothing is written and Commit returns why (a *[fence.StaleError], [fence.ErrNotClaimed],
// [fence.ErrDuplicate], [fence.ErrOverlap], [fence.ErrConflict], [ErrCommand], [ErrCrossSlot],
// [fence.ErrInvalid]). A commit whose reply was lost (connection, ctx) may have been applied:
// retrying the batch is safe, and a retry that fails with fence.ErrDuplicate proves it was.
// go-redis makes that retry itself after a network error unless the client's MaxRetries is
// -1: the commit then returns the retry's ErrDuplicate (a Recover, its fence.ErrConflict).
func (tx *Tx) Commit(ctx context.Context) error {
	if tx.done {
		return fmt.Errorf("%w: the transaction has ended", fence.ErrInvalid)
	}
	tx.done = true
	err := tx.commit(ctx)
	if err != nil {
		_ = tx.release(context.WithoutCancel(ctx))
	}
	return err
}

func (tx *Tx) commit(ctx context.Context) error {
	if tx.err != nil {
		return tx.err
	}
	if len(tx.ops) == 0 {
		return tx.release(ctx)
	}
	for _, a := range tx.admits {
		o := &tx.ops[a.i]
		o.args = []string{"0", "", "", ""}
		if a.found {
			o.args = []string{"1", i64(a.stored.Era), i64(a.stored.Epoch), i64(a.storedSeq)}
		}
		if a.write {
			o.args = append(o.args, i64(a.next.Era), i64(a.next.Epoch), i64(a.nextSeq))
		} else {
			o.args = append(o.args, "", "", "")
		}
	}
	var keys []string
	index := map[string]string{}
	args := []any{tx.id}
	for _, o := range tx.ops {
		args = append(args, o.code)
		for _, k := range o.keys {
			i, ok := index[k]
			if !ok {
				keys = append(keys, k)
				i = strconv.Itoa(len(keys))
				index[k] = i
			}
			args = append(args, i)
		}
		for _, a := range o.args {
			args = append(args, a)
		}
	}
	if tx.s.isCluster() {
		for _, k := range keys[1:] {
			if slot(k) != slot(keys[0]) {
				return fmt.Errorf("%w: %q (slot %d) and %q (slot %d); refused before running", ErrCrossSlot, keys[0], slot(keys[0]), k, slot(k))
			}
		}
	}
	r, err := tx.s.run(ctx, commitScript, keys, args...)
	if err != nil {
		return fmt.Errorf("redisfence: commit: %w", err)
	}
	switch r[0] {
	case "ok":
		return nil
	case "no":
		if n, err := strconv.Atoi(r[1]); err == nil && n >= 1 && n <= len(tx.ops) && tx.ops[n-1].code == "adv" {
			o := tx.ops[n-1]
			st, err := parseState(r[2:])
			if err != nil {
				return err
			}
			if err := fencecheck.CheckAdvance(o.k, st, o.t, o.first, o.to); err != nil {
				return err
			}
			return fmt.Errorf("%w: advance %s under %s over %d..%d, stored %s at %d", errBroken, o.k, o.t, o.first, o.to, st.Token, st.Position)
		}
	case "conflict":
		return fmt.Errorf("%w: a keyed fence changed after this transaction admitted against it (its hold expired); run the transaction again", fence.ErrConflict)
	case "command":
		if len(r) == 3 {
			return fmt.Errorf("%w: operation %s: %s; nothing was written", ErrCommand, r[1], r[2])
		}
	}
	return fmt.Errorf("redisfence: commit: unexpected reply %q", r)
}

// Rollback ends tx without writing and releases what it holds. After Commit it does nothing.
func (tx *Tx) Rollback(ctx context.Context) error {
	if tx.done {
		return nil
	}
	tx.done = true
	return tx.release(ctx)
}

func (tx *Tx) release(ctx context.Context) error {
	var errs []error
	for _, h := range tx.holds { // one script each: on a cluster they may be in different slots
		if _, err := releaseScript.Run(ctx, tx.s.c, []string{h}, tx.id).Result(); err != nil {
			errs = append(errs, err)
		}
	}
	tx.holds = nil
	return errors.Join(errs...)
}
