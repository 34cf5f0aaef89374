package pgfence

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/fencecheck"
	"github.com/batonhq/baton/internal/pgmigrate"
	"github.com/batonhq/baton/internal/pgtx"
	"github.com/batonhq/baton/internal/sqlident"
)

// DB is what a Store needs from PostgreSQL: *pgxpool.Pool and *pgx.Conn both satisfy it (a
// *pgx.Conn is not safe for concurrent use, so neither is a Store built on one).
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

const (
	defaultTable      = "baton_fences"
	recoveriesSuffix  = "_recoveries"
	keyedSuffix       = "_keyed"
	topicsSuffix      = "_topics"
	migrateLockPrefix = "baton/pgfence/migrate"
)

type config struct {
	table string
}

// Option configures a [Store]. Invalid values make [New] fail.
type Option func(*config) error

// Table sets the fence table, "name" or "schema.name" (default "baton_fences", resolved through
// the connection's search_path). The store's other tables are named after it: name+"_recoveries"
// (the Recover audit trail), name+"_keyed" (the per-entity fences of Admit) and name+"_topics"
// (the topic identities). Names must match [A-Za-z_][A-Za-z0-9_]* per part, at most 63 bytes
// with the suffixes; they are always quoted, so they are case-sensitive.
func Table(name string) Option { return func(c *config) error { c.table = name; return nil } }

// Store is a fenced sink in PostgreSQL: a fence table next to the caller's data, checked and
// advanced in the caller's transaction. It is safe for concurrent use when its DB is.
type Store struct {
	db     DB
	schema string    // schema.sql with the quoted names substituted
	tables [4]string // fence, recoveries, keyed, topics table names as configured (RuntimeGrants)

	sqlClaim, sqlLoad, sqlAdvance, sqlRecover, sqlRecoveries string
	sqlAdmit, sqlLoadKeyed                                   string

	sqlRecoveryInsert                                                          string
	sqlTopicLoad, sqlTopicInsert, sqlTopicHistory, sqlTopicLock, sqlTopicReset string // fence.Topics
}

var (
	_ fence.Sink[pgx.Tx]      = (*Store)(nil)
	_ fence.KeyedSink[pgx.Tx] = (*Store)(nil)
)

//go:embed schema.sql
var schemaSQL string

// New returns a Store on db. It does no I/O: call [Store.Migrate] to create the tables (or
// create them yourself from [Store.Schema]). A nil option or an invalid table name fails with
// an error wrapping fence.ErrInvalid; every problem is reported, joined with errors.Join.
func New(db DB, opts ...Option) (*Store, error) {
	var errs []error
	if db == nil {
		errs = append(errs, fmt.Errorf("%w: pgfence: nil DB", fence.ErrInvalid))
	}
	c := config{table: defaultTable}
	for i, o := range opts {
		if o == nil {
			errs = append(errs, fmt.Errorf("%w: pgfence: option %d is nil", fence.ErrInvalid, i))
			continue
		}
		if err := o(&c); err != nil {
			errs = append(errs, err)
		}
	}
	recoveries, keyed, topics := c.table+recoveriesSuffix, c.table+keyedSuffix, c.table+topicsSuffix
	for _, n := range []struct{ what, name string }{
		{"table", c.table}, {"recoveries table", recoveries}, {"keyed table", keyed}, {"topics table", topics},
	} {
		if err := sqlident.Validate(n.name); err != nil {
			errs = append(errs, fmt.Errorf("%w: pgfence: %s: %w", fence.ErrInvalid, n.what, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	f, r, k, tp := sqlident.Quote(c.table), sqlident.Quote(recoveries), sqlident.Quote(keyed), sqlident.Quote(topics)
	s := &Store{
		db:     db,
		tables: [4]string{c.table, recoveries, keyed, topics},
		schema: strings.NewReplacer("{{fences}}", f, "{{recoveries}}", r, "{{keyed}}", k, "{{topics}}", tp).Replace(schemaSQL),
	}
	s.prepareSQL(f, r, k)
	s.prepareTopicSQL(f, r, tp)
	return s, nil
}

// Table returns the fence table's name, as configured with [Table]: the table pgoutbox checks
// tokens against.
func (s *Store) Table() string { return s.tables[0] }

// Schema returns the DDL Migrate runs, with the configured table names, for users who manage
// migrations with their own tools.
func (s *Store) Schema() string { return s.schema }

// Migrate creates the tables if they do not exist. It is idempotent and safe to call
// concurrently (from several processes too): the DDL runs in one transaction holding a
// transaction-scoped advisory lock, because concurrent CREATE TABLE IF NOT EXISTS of the same
// table can otherwise fail on the catalog's unique indexes.
func (s *Store) Migrate(ctx context.Context) error {
	return pgmigrate.Run(ctx, s.db, migrateLockPrefix, s.schema, "pgfence: migrate")
}

func (s *Store) prepareSQL(f, r, k string) {
	// The fence row is inserted when missing only for era 0 (a token of a later era on a
	// fence that does not exist would invent an era; eras advance only through Recover).
	// When the row exists the INSERT always conflicts, and ON CONFLICT DO UPDATE locks the
	// row and re-evaluates its WHERE on the latest committed version: that lock is what
	// serializes writers of one fence. The WHERE clauses are CheckClaim and CheckAdvance
	// written in SQL: same era and a higher epoch, or the same epoch already held by this
	// claimant (or by nobody: the zero token of a fence never claimed); to advance, exactly
	// the stored token and a batch starting after the stored position.
	const exists = `EXISTS (SELECT 1 FROM %[1]s e WHERE e.group_id = $1 AND e.topic = $2 AND e.partition = $3)`
	s.sqlClaim = fmt.Sprintf(`INSERT INTO %[1]s AS f (group_id, topic, partition, era, epoch, position, claimant, updated_at)
SELECT $1::text, $2::text, $3::integer, $4::bigint, $5::bigint, -1, $6::text, now()
WHERE $4::bigint = 0 OR `+exists+`
ON CONFLICT (group_id, topic, partition) DO UPDATE
SET epoch = EXCLUDED.epoch, claimant = EXCLUDED.claimant, updated_at = EXCLUDED.updated_at
WHERE f.era = EXCLUDED.era AND (f.epoch < EXCLUDED.epoch OR (f.epoch = EXCLUDED.epoch AND
  (f.claimant = EXCLUDED.claimant OR (f.claimant = '' AND f.era = 0 AND f.epoch = 0))))
RETURNING f.era, f.epoch, f.position, f.claimant`, f)

	s.sqlLoad = fmt.Sprintf(`SELECT era, epoch, position, claimant FROM %s WHERE group_id = $1 AND topic = $2 AND partition = $3`, f)

	// A missing fence is the zero token: only a write under the zero token may create it.
	s.sqlAdvance = fmt.Sprintf(`INSERT INTO %[1]s AS f (group_id, topic, partition, era, epoch, position, updated_at)
SELECT $1::text, $2::text, $3::integer, $4::bigint, $5::bigint, $7::bigint, now()
WHERE ($4::bigint = 0 AND $5::bigint = 0) OR `+exists+`
ON CONFLICT (group_id, topic, partition) DO UPDATE
SET position = EXCLUDED.position, updated_at = EXCLUDED.updated_at
WHERE f.era = EXCLUDED.era AND f.epoch = EXCLUDED.epoch AND f.position < $6::bigint`, f)

	// Recover is one statement: the compare-and-set on the fence and the audit row commit
	// together or not at all. A missing fence counts as the zero token.
	s.sqlRecover = fmt.Sprintf(`WITH cas AS (
INSERT INTO %[1]s AS f (group_id, topic, partition, era, epoch, position, claimant, updated_at)
SELECT $1::text, $2::text, $3::integer, $6::bigint, $7::bigint, -1, $9::text, now()
WHERE ($4::bigint = 0 AND $5::bigint = 0) OR `+exists+`
ON CONFLICT (group_id, topic, partition) DO UPDATE
SET era = EXCLUDED.era, epoch = EXCLUDED.epoch, claimant = EXCLUDED.claimant, updated_at = EXCLUDED.updated_at
WHERE f.era = $4::bigint AND f.epoch = $5::bigint
RETURNING f.era)
INSERT INTO %[2]s (group_id, topic, partition, from_era, from_epoch, to_era, to_epoch, reason, at)
SELECT $1::text, $2::text, $3::integer, $4::bigint, $5::bigint, $6::bigint, $7::bigint, $8::text, now() FROM cas`, f, r)

	s.sqlRecoveries = fmt.Sprintf(`SELECT from_era, from_epoch, to_era, to_epoch, reason, at FROM %s
WHERE group_id = $1 AND topic = $2 AND partition = $3 ORDER BY seq`, r)

	s.sqlAdmit = fmt.Sprintf(`INSERT INTO %[1]s AS k (scope, id, era, epoch, seq, updated_at)
VALUES ($1::text, $2::text, $3::bigint, $4::bigint, $5::bigint, now())
ON CONFLICT (scope, id) DO UPDATE
SET era = EXCLUDED.era, epoch = EXCLUDED.epoch, seq = EXCLUDED.seq, updated_at = EXCLUDED.updated_at
WHERE (k.era, k.epoch, k.seq) < (EXCLUDED.era, EXCLUDED.epoch, EXCLUDED.seq)`, k)

	s.sqlLoadKeyed = fmt.Sprintf(`SELECT era, epoch, seq FROM %s WHERE scope = $1 AND id = $2`, k)
}

// maxAttempts bounds the retries of a conditional write whose refusal the follow-up read
// cannot explain. That happens only when a concurrent Recover raised the era between the
// statement and the read of a fence the statement did not lock (a missing fence, or Claim,
// which runs outside a transaction); stored state only grows, so one retry settles it.
const maxAttempts = 3

// Claim raises the fence to t if the stored token is not higher and of the same era, and
// returns the state afterwards. See fence.Sink.
func (s *Store) Claim(ctx context.Context, k fence.Key, t fence.Token, claimant string) (fence.State, error) {
	if err := fencecheck.ValidateClaim(k, t, claimant); err != nil {
		return fence.State{}, err
	}
	for range maxAttempts {
		var st fence.State
		err := s.db.QueryRow(ctx, s.sqlClaim, k.Group, k.Topic, k.Partition, t.Era, t.Epoch, claimant).
			Scan(&st.Token.Era, &st.Token.Epoch, &st.Position, &st.Claimant)
		if err == nil {
			return st, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return fence.State{}, fmt.Errorf("pgfence: claim %s: %w", k, err)
		}
		stored, err := s.load(ctx, s.db, k)
		if err != nil {
			return fence.State{}, fmt.Errorf("pgfence: claim %s: %w", k, err)
		}
		if err := fencecheck.CheckClaim(k, stored, t, claimant); err != nil {
			return fence.State{}, err
		}
	}
	return fence.State{}, fmt.Errorf("pgfence: claim %s: refused %d times though the stored state admits %s", k, maxAttempts, t)
}

// Load returns the stored state of k, the zero token and fence.NoPosition if never claimed.
func (s *Store) Load(ctx context.Context, k fence.Key) (fence.State, error) {
	if err := fencecheck.ValidateKey(k); err != nil {
		return fence.State{}, err
	}
	st, err := s.load(ctx, s.db, k)
	if err != nil {
		return fence.State{}, fmt.Errorf("pgfence: load %s: %w", k, err)
	}
	return st, nil
}

type queryRower interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func (s *Store) load(ctx context.Context, q queryRower, k fence.Key) (fence.State, error) {
	var st fence.State
	err := q.QueryRow(ctx, s.sqlLoad, k.Group, k.Topic, k.Partition).Scan(&st.Token.Era, &st.Token.Epoch, &st.Position, &st.Claimant)
	if errors.Is(err, pgx.ErrNoRows) {
		return fence.State{Position: fence.NoPosition}, nil
	}
	return st, err
}

func (s *Store) advanceArgs(k fence.Key, t fence.Token, first, last int64) []any {
	return []any{k.Group, k.Topic, k.Partition, t.Era, t.Epoch, first, last}
}

// Advance checks and advances the fence of k over the batch first..last under t inside tx,
// with one statement. It fails with a *fence.StaleError if a higher token is stored,
// fence.ErrNotClaimed if t is higher than the stored token, fence.ErrDuplicate if the stored
// position is at or beyond last, fence.ErrOverlap if it lies within first..last, and
// fence.ErrInvalid if t is of an era the fence never reached. On success the fence row stays locked until tx ends, so no other writer of k
// can commit in between; on any error the caller must roll tx back.
func (s *Store) Advance(ctx context.Context, tx pgx.Tx, k fence.Key, t fence.Token, first, last int64) error {
	if err := fencecheck.ValidateWrite(k, t, first, last); err != nil {
		return err
	}
	args := s.advanceArgs(k, t, first, last)
	for range maxAttempts {
		tag, err := pgtx.Exec(ctx, tx, s.sqlAdvance, args...) // its tag, in a pipelining tx too
		if err != nil {
			return fmt.Errorf("pgfence: advance %s: %w", k, err)
		}
		if tag.RowsAffected() == 1 {
			return nil
		}
		if err := s.refused(ctx, tx, k, t, first, last); !errors.Is(err, errAdmits) {
			return err
		}
	}
	return fmt.Errorf("pgfence: advance %s: refused %d times though the stored state admits %s at %d..%d", k, maxAttempts, t, first, last)
}

var errAdmits = errors.New("pgfence: stored state admits the write")

// refused explains why the advance statement matched no row, by reading the fence with q (the
// same transaction when it is still usable: the refused ON CONFLICT has locked the row, so the
// read sees exactly the version that refused). It returns errAdmits if the state read admits
// the write after all.
func (s *Store) refused(ctx context.Context, q queryRower, k fence.Key, t fence.Token, first, last int64) error {
	stored, err := s.load(ctx, q, k)
	if err != nil {
		return fmt.Errorf("pgfence: advance %s: read refused fence: %w", k, err)
	}
	if err := fencecheck.CheckAdvance(k, stored, t, first, last); err != nil {
		return err
	}
	return errAdmits
}

// Apply runs fn in a new transaction after Advance, and commits both or neither. See
// fence.Sink. fn's transaction pipelines: its Exec queues the statement and returns an empty
// pgconn.CommandTag, and the queued statements travel in one round trip at the next read
// (Query, QueryRow), SendBatch, CopyFrom, Prepare, Begin, LargeObjects, Conn or before the
// commit; a statement's error surfaces there, naming the statement, and nothing commits (see
// the package documentation). A commit whose outcome is unknown fails with
// [ErrCommitUnknown]. [Store.ApplyBatch] also saves the fence's round trip.
func (s *Store) Apply(ctx context.Context, k fence.Key, t fence.Token, first, last int64, fn func(ctx context.Context, tx pgx.Tx) error) error {
	if err := fencecheck.ValidateWrite(k, t, first, last); err != nil {
		return err
	}
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pgfence: apply %s: begin: %w", k, err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // no-op after a commit
	if err := s.Advance(ctx, tx, k, t, first, last); err != nil {
		return err
	}
	p := pgtx.NewPipe(ctx, tx, "pgfence", nil, false)
	if err := fn(ctx, p); err != nil {
		return pgtx.Classify(err)
	}
	if err := p.Flush(ctx); err != nil { // fn's queued statements; a failure commits nothing
		return pgtx.Classify(err)
	}
	return pgtx.Classify(commit(ctx, tx, k))
}

// AdvanceBatch is Advance pipelined with the caller's statements inside the caller's tx: the
// fence statement is queued first in one pgx.Batch and fn queues the caller's statements
// after it, so the fence costs one statement, not one round trip. The caller's statements run
// only after the fence statement has taken the fence row's lock, and in a refused batch they
// run too but are rolled back with tx (non-transactional effects, such as sequence values,
// remain). Results of the caller's queued statements reach the callbacks set on them with
// QueuedQuery.Exec/Query/QueryRow. fn must not remove the first queued statement.
//
// The errors are those of Advance, or the first error of the caller's statements; on any error
// the caller must roll back.
func (s *Store) AdvanceBatch(ctx context.Context, tx pgx.Tx, k fence.Key, t fence.Token, first, last int64, fn func(b *pgx.Batch) error) error {
	if err := fencecheck.ValidateWrite(k, t, first, last); err != nil {
		return err
	}
	b := &pgx.Batch{}
	b.Queue(s.sqlAdvance, s.advanceArgs(k, t, first, last)...)
	if err := fn(b); err != nil {
		return err
	}
	br := tx.SendBatch(ctx, b)
	tag, ferr := br.Exec()
	cerr := br.Close() // reads the caller's results, running their callbacks
	if ferr != nil {
		return pgtx.Fence(fmt.Errorf("pgfence: advance %s: %w", k, ferr))
	}
	if tag.RowsAffected() == 1 {
		return cerr
	}
	if cerr == nil {
		// tx is usable and holds the row lock: classify exactly, and retry on the
		// (recovery-race) case where the stored state admits the write.
		if err := s.refused(ctx, tx, k, t, first, last); !errors.Is(err, errAdmits) {
			return err
		}
		return s.Advance(ctx, tx, k, t, first, last)
	}
	// A caller's statement failed, so tx is aborted: classify from the committed state.
	// The refusal stands either way, since the caller's statements must be rolled back.
	if err := s.refused(ctx, s.db, k, t, first, last); !errors.Is(err, errAdmits) {
		return err
	}
	return cerr
}

// ApplyBatch is Apply with the pipelining of [Store.AdvanceBatch]: begin, one batch holding
// the fence statement and the statements fn queues, commit. It costs the same round trips as
// the same batch without a fence.
func (s *Store) ApplyBatch(ctx context.Context, k fence.Key, t fence.Token, first, last int64, fn func(b *pgx.Batch) error) error {
	if err := fencecheck.ValidateWrite(k, t, first, last); err != nil {
		return err
	}
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pgfence: apply %s: begin: %w", k, err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := s.AdvanceBatch(ctx, tx, k, t, first, last, fn); err != nil {
		return err
	}
	return commit(ctx, tx, k)
}

// commit commits tx and tells a refused commit (nothing committed) from one whose outcome is
// unknown (ErrCommitUnknown).
func commit(ctx context.Context, tx pgx.Tx, k fence.Key) error {
	return pgtx.Commit(ctx, tx, "pgfence", k, ErrCommitUnknown)
}

// Recover compare-and-sets the fence of k from expected to {expected.Era+1, epoch} and records
// the recovery, in one statement. It fails with fence.ErrConflict if the stored token is not
// expected (a fence never claimed stores the zero token). See fence.Sink.
func (s *Store) Recover(ctx context.Context, k fence.Key, expected fence.Token, epoch int64, claimant, reason string) (fence.Token, error) {
	if err := fencecheck.ValidateRecover(k, expected, epoch, claimant, reason); err != nil {
		return fence.Token{}, err
	}
	if expected.Era == 1<<63-1 {
		return fence.Token{}, fmt.Errorf("%w: pgfence: recover %s: era %d cannot be raised", fence.ErrInvalid, k, expected.Era)
	}
	if !utf8.ValidString(reason) || strings.IndexByte(reason, 0) >= 0 {
		return fence.Token{}, fmt.Errorf("%w: pgfence: recover %s: reason must be UTF-8 without NUL bytes", fence.ErrInvalid, k)
	}
	to := fence.Token{Era: expected.Era + 1, Epoch: epoch}
	tag, err := s.db.Exec(ctx, s.sqlRecover, k.Group, k.Topic, k.Partition,
		expected.Era, expected.Epoch, to.Era, to.Epoch, reason, claimant)
	if err != nil {
		return fence.Token{}, fmt.Errorf("pgfence: recover %s: %w", k, err)
	}
	if tag.RowsAffected() != 1 {
		return fence.Token{}, fmt.Errorf("%w: %s: stored token is not %s", fence.ErrConflict, k, expected)
	}
	return to, nil
}

// Recoveries lists the recoveries recorded for k, oldest first.
func (s *Store) Recoveries(ctx context.Context, k fence.Key) ([]fence.Recovery, error) {
	if err := fencecheck.ValidateKey(k); err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, s.sqlRecoveries, k.Group, k.Topic, k.Partition)
	if err != nil {
		return nil, fmt.Errorf("pgfence: recoveries %s: %w", k, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (fence.Recovery, error) {
		r := fence.Recovery{Key: k}
		err := row.Scan(&r.From.Era, &r.From.Epoch, &r.To.Era, &r.To.Epoch, &r.Reason, &r.At)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("pgfence: recoveries %s: %w", k, err)
	}
	return out, nil
}

// Admit compares (t, seq) with what is stored for (scope, id) inside tx, with one statement,
// and stores it if higher. See fence.KeyedSink. The entity row stays locked until tx ends.
func (s *Store) Admit(ctx context.Context, tx pgx.Tx, scope, id string, t fence.Token, seq int64) (fence.Verdict, error) {
	if err := fencecheck.ValidateAdmit(scope, id, t, seq); err != nil {
		return 0, err
	}
	tag, err := pgtx.Exec(ctx, tx, s.sqlAdmit, scope, id, t.Era, t.Epoch, seq) // its tag, in a pipelining tx too
	if err != nil {
		return 0, fmt.Errorf("pgfence: admit %s/%s: %w", scope, id, err)
	}
	if tag.RowsAffected() == 1 {
		return fence.Admitted, nil
	}
	// The refused ON CONFLICT locked the row; this read sees the version that refused.
	var stored fence.Token
	var storedSeq int64
	if err := tx.QueryRow(ctx, s.sqlLoadKeyed, scope, id).Scan(&stored.Era, &stored.Epoch, &storedSeq); err != nil {
		return 0, fmt.Errorf("pgfence: admit %s/%s: read refused fence: %w", scope, id, err)
	}
	v := fencecheck.CheckAdmit(stored, storedSeq, true, t, seq)
	if v == fence.Admitted {
		return 0, fmt.Errorf("pgfence: admit %s/%s: refused though stored %s/%d admits %s/%d", scope, id, stored, storedSeq, t, seq)
	}
	return v, nil
}
