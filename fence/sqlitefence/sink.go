package sqlitefence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/fencecheck"
)

// errBroken reports a fence row that changed between a failed conditional write and the read
// that classifies it, which the write lock held in between makes impossible.
var errBroken = errors.New("sqlitefence: conditional write affected no row, yet the stored state admits it")

// Claim implements [fence.Sink]: it raises the stored token to t in its own transaction and
// returns the state afterwards. It fails with a *[fence.StaleError] if the stored token is
// higher, with [fence.ErrInvalid] if t is of a later era than the stored token, and with
// [ErrBusy] if the write lock stayed busy past the busy timeout.
func (s *Store) Claim(ctx context.Context, k fence.Key, t fence.Token, claimant string) (fence.State, error) {
	if err := fencecheck.ValidateClaim(k, t, claimant); err != nil {
		return fence.State{}, err
	}
	var st fence.State
	err := s.writeTx(ctx, func(ctx context.Context, tx *sql.Tx, _ func()) error {
		var err error
		st, err = s.claim(ctx, tx, k, t, claimant)
		return err
	})
	if err != nil {
		return fence.State{}, err
	}
	return st, nil
}

func (s *Store) claim(ctx context.Context, tx *sql.Tx, k fence.Key, t fence.Token, claimant string) (fence.State, error) {
	var pos int64
	err := tx.QueryRowContext(ctx, s.q.claimUpdate, k.Group, k.Topic, k.Partition, t.Era, t.Epoch, claimant).Scan(&pos)
	if err == nil {
		return fence.State{Token: t, Position: pos, Claimant: claimant}, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return fence.State{}, err
	}
	if t.Era == 0 {
		res, err := tx.ExecContext(ctx, s.q.claimInsert, k.Group, k.Topic, k.Partition, t.Epoch, claimant)
		if n, err := affected(res, err); err != nil {
			return fence.State{}, err
		} else if n == 1 {
			return fence.State{Token: t, Position: fence.NoPosition, Claimant: claimant}, nil
		}
	}
	cur, err := s.loadTx(ctx, tx, k)
	if err != nil {
		return fence.State{}, err
	}
	if err := fencecheck.CheckClaim(k, cur, t, claimant); err != nil {
		return fence.State{}, err
	}
	return fence.State{}, fmt.Errorf("%w: claim %s with %s, stored %s", errBroken, k, t, cur.Token)
}

// Load implements [fence.Sink]: it returns the stored state, the zero token and
// [fence.NoPosition] for a key never claimed.
func (s *Store) Load(ctx context.Context, k fence.Key) (fence.State, error) {
	if err := fencecheck.ValidateKey(k); err != nil {
		return fence.State{}, err
	}
	st, err := s.loadTx(ctx, s.db, k)
	return st, wrapBusy(err)
}

// querier is what *sql.DB and *sql.Tx share.
type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func (s *Store) loadTx(ctx context.Context, q querier, k fence.Key) (fence.State, error) {
	st := fence.State{Position: fence.NoPosition}
	err := q.QueryRowContext(ctx, s.q.load, k.Group, k.Topic, k.Partition).Scan(&st.Token.Era, &st.Token.Epoch, &st.Position, &st.Claimant)
	if errors.Is(err, sql.ErrNoRows) {
		return st, nil
	}
	return st, err
}

// Apply implements [fence.Sink]: in one transaction it checks and advances the fence over the
// batch first..last under t, runs fn, and commits. It fails with a *[fence.StaleError], with
// [fence.ErrNotClaimed], [fence.ErrDuplicate], [fence.ErrOverlap], with [fence.ErrInvalid] for a token of a later era than the stored one,
// with fn's error, or with [ErrBusy]; in each case nothing is committed. SQLITE_BUSY before fn
// runs is retried within the busy timeout; fn is never run twice by one Apply.
func (s *Store) Apply(ctx context.Context, k fence.Key, t fence.Token, first, last int64, fn func(ctx context.Context, tx *sql.Tx) error) error {
	if err := fencecheck.ValidateWrite(k, t, first, last); err != nil {
		return err
	}
	if fn == nil {
		return fmt.Errorf("%w: nil function", fence.ErrInvalid)
	}
	return s.writeTx(ctx, func(ctx context.Context, tx *sql.Tx, irrevocable func()) error {
		if err := s.advance(ctx, tx, k, t, first, last); err != nil {
			return err
		}
		irrevocable()
		return fn(ctx, tx)
	})
}

// Advance implements [fence.Sink]: the check-and-advance of Apply inside tx, which the caller
// began on [Store.DB] (a transaction of another *sql.DB is refused once the store's statements
// are prepared, as they are after [Store.Migrate]) and must roll back on any
// error. Its conditional UPDATE is a write, so from here on tx holds SQLite's write lock until
// it ends. It fails like Apply; a busy error (the lock was not had within the connection's
// busy_timeout, or a DEFERRED tx that had already read could not upgrade) is wrapped in
// [ErrBusy] and cannot be retried inside tx.
func (s *Store) Advance(ctx context.Context, tx *sql.Tx, k fence.Key, t fence.Token, first, last int64) error {
	if err := fencecheck.ValidateWrite(k, t, first, last); err != nil {
		return err
	}
	if tx == nil {
		return fmt.Errorf("%w: nil transaction", fence.ErrInvalid)
	}
	return wrapBusy(s.advance(ctx, tx, k, t, first, last))
}

func (s *Store) advance(ctx context.Context, tx *sql.Tx, k fence.Key, t fence.Token, first, last int64) error {
	res, err := s.stmts.exec(ctx, s.db, s.q, tx, func(p *preparedStmts) *sql.Stmt { return p.advance }, s.q.advanceUpdate,
		k.Group, k.Topic, k.Partition, t.Era, t.Epoch, first, last)
	n, err := affected(res, err)
	if err != nil || n == 1 {
		return err
	}
	if t.IsZero() { // a missing fence is the zero token: only a write under it may create it
		res, err := tx.ExecContext(ctx, s.q.advanceInsert, k.Group, k.Topic, k.Partition, last)
		n, err := affected(res, err)
		if err != nil || n == 1 {
			return err
		}
	}
	cur, err := s.loadTx(ctx, tx, k)
	if err != nil {
		return err
	}
	if err := fencecheck.CheckAdvance(k, cur, t, first, last); err != nil {
		return err
	}
	return fmt.Errorf("%w: advance %s under %s over %d..%d, stored %s at %d", errBroken, k, t, first, last, cur.Token, cur.Position)
}

// Recover implements [fence.Sink]: if the stored token equals expected it stores
// Token{Era: expected.Era+1, Epoch: epoch}, keeps the stored position, records a
// [fence.Recovery] in the same transaction and returns the new token. Otherwise it fails with
// [fence.ErrConflict] and changes nothing.
func (s *Store) Recover(ctx context.Context, k fence.Key, expected fence.Token, epoch int64, claimant, reason string) (fence.Token, error) {
	if err := fencecheck.ValidateRecover(k, expected, epoch, claimant, reason); err != nil {
		return fence.Token{}, err
	}
	if expected.Era == math.MaxInt64 {
		return fence.Token{}, fmt.Errorf("%w: era %d cannot advance", fence.ErrInvalid, expected.Era)
	}
	to := fence.Token{Era: expected.Era + 1, Epoch: epoch}
	err := s.writeTx(ctx, func(ctx context.Context, tx *sql.Tx, _ func()) error {
		var res sql.Result
		var err error
		if expected.IsZero() {
			res, err = tx.ExecContext(ctx, s.q.recoverFromZero, k.Group, k.Topic, k.Partition, epoch, claimant)
		} else {
			res, err = tx.ExecContext(ctx, s.q.recoverUpdate, k.Group, k.Topic, k.Partition, expected.Era, expected.Epoch, epoch, claimant)
		}
		n, err := affected(res, err)
		if err != nil {
			return err
		}
		if n != 1 {
			cur, err := s.loadTx(ctx, tx, k)
			if err != nil {
				return err
			}
			return fmt.Errorf("%w: %s: expected %s, stored %s", fence.ErrConflict, k, expected, cur.Token)
		}
		_, err = tx.ExecContext(ctx, s.q.recoveryInsert, k.Group, k.Topic, k.Partition,
			expected.Era, expected.Epoch, to.Era, to.Epoch, reason, time.Now().UnixNano())
		return err
	})
	if err != nil {
		return fence.Token{}, err
	}
	return to, nil
}

// Recoveries implements [fence.Sink]: the recorded recoveries of k, oldest first.
func (s *Store) Recoveries(ctx context.Context, k fence.Key) ([]fence.Recovery, error) {
	if err := fencecheck.ValidateKey(k); err != nil {
		return nil, err
	}
	rows, err := s.db.QueryContext(ctx, s.q.recoveries, k.Group, k.Topic, k.Partition)
	if err != nil {
		return nil, wrapBusy(err)
	}
	defer rows.Close()
	var out []fence.Recovery
	for rows.Next() {
		r := fence.Recovery{Key: k}
		var at int64
		if err := rows.Scan(&r.From.Era, &r.From.Epoch, &r.To.Era, &r.To.Epoch, &r.Reason, &at); err != nil {
			return nil, err
		}
		r.At = time.Unix(0, at)
		out = append(out, r)
	}
	return out, wrapBusy(rows.Err())
}

// Admit implements [fence.KeyedSink] inside tx, which the caller began on [Store.DB] and must
// roll back on error. It stores (t, seq) for (scope, id) if it is higher than
// what is stored and returns [fence.Admitted]; otherwise it stores nothing and returns
// [fence.Stale] (lower token) or [fence.Duplicate] (same token, sequence not higher).
func (s *Store) Admit(ctx context.Context, tx *sql.Tx, scope, id string, t fence.Token, seq int64) (fence.Verdict, error) {
	if err := fencecheck.ValidateAdmit(scope, id, t, seq); err != nil {
		return 0, err
	}
	if tx == nil {
		return 0, fmt.Errorf("%w: nil transaction", fence.ErrInvalid)
	}
	res, err := s.stmts.exec(ctx, s.db, s.q, tx, func(p *preparedStmts) *sql.Stmt { return p.admit }, s.q.admit,
		scope, id, t.Era, t.Epoch, seq)
	n, err := affected(res, err)
	if err != nil {
		return 0, wrapBusy(err)
	}
	if n == 1 {
		return fence.Admitted, nil
	}
	var stored fence.Token
	var storedSeq int64
	err = tx.QueryRowContext(ctx, s.q.loadKeyed, scope, id).Scan(&stored.Era, &stored.Epoch, &storedSeq)
	if err != nil {
		return 0, wrapBusy(err)
	}
	v := fencecheck.CheckAdmit(stored, storedSeq, true, t, seq)
	if v == fence.Admitted {
		return 0, fmt.Errorf("%w: admit %s/%s at %s/%d, stored %s/%d", errBroken, scope, id, t, seq, stored, storedSeq)
	}
	return v, nil
}

func affected(res sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
