// Package pgfence is the fenced sink in PostgreSQL, on pgx/v5: it keeps, for each
// (consumer group, topic, partition), the highest accepted token and the last applied
// position in a table next to the caller's data, and checks and advances them inside the
// transaction that writes the data. It implements fence.Sink[pgx.Tx] and
// fence.KeyedSink[pgx.Tx] and passes the fencetest conformance suite against a real server.
//
// # Use
//
//	s, err := pgfence.New(pool)            // validates names; no I/O
//	err = s.Migrate(ctx)                   // CREATE TABLE IF NOT EXISTS, idempotent
//	st, err := s.Claim(ctx, key, token, claimant) // on assignment; resume after st.Position
//	err = s.ApplyBatch(ctx, key, token, firstOffset, lastOffset, func(b *pgx.Batch) error {
//		b.Queue(`INSERT INTO kv ...`, ...) // the caller's writes, pipelined after the fence
//		return nil
//	})
//
// Migrate is explicit rather than run by New: New takes no context and does no I/O, and
// deployments that own their migrations can take the DDL from [Store.Schema] instead. Migrate
// may be called repeatedly and concurrently, from many processes: it holds a transaction-scoped
// advisory lock around CREATE TABLE IF NOT EXISTS.
//
// # Guarantees
//
// The fence lives in the same database and commits in the same transaction as the data, so a
// batch's writes and its fence advance commit together or not at all. Every fence write is
// one conditional statement (INSERT ... ON CONFLICT DO UPDATE ... WHERE) whose WHERE clause is
// the shared rule of package fence (to claim: same era and a higher epoch, or the same epoch
// held by the same claimant; to write: exactly the stored token and a batch starting after
// the stored position); a refusal affects zero rows, and the stored row is then read to
// report a *fence.StaleError, fence.ErrNotClaimed, fence.ErrDuplicate, fence.ErrOverlap or
// fence.ErrInvalid exactly as the rules every store of this module shares (internal/fencecheck) would. Because the
// claimant is compared in the claiming statement, two claimants of the same token cannot
// both win, whatever they read before. Migrate adds the claimant column to fence tables
// created before it existed (ALTER TABLE ... ADD COLUMN IF NOT EXISTS); their rows hold
// their token for nobody, so an equal claim of one is refused and goes through the
// consumer's verify-and-recover path once.
//
// Why a lower token can never commit after a higher one, under READ COMMITTED (PostgreSQL's
// default): ON CONFLICT DO UPDATE takes the fence row's lock before it evaluates its WHERE
// clause, and holds it until the transaction ends. A writer that arrives while another
// transaction holds the lock waits; when that transaction commits, PostgreSQL re-evaluates
// the waiting statement's WHERE against the newly committed row version, so a lower token (or
// a batch overlapping an already applied position) now matches nothing and is refused. Between a successful
// advance and its commit no other writer of the same fence can commit. The test suite proves
// this against the server (TestAdvanceRace: the second writer is observed waiting in pg_locks,
// then refused as an overlap). Under REPEATABLE READ or SERIALIZABLE the same race ends in a serialization
// failure (SQLSTATE 40001) instead of a StaleError: still safe, but retried by nobody.
//
// Because the refusing statement also locked the row, the read that classifies a refusal
// sees the very version that refused. The only unlocked case is a token of a later era on a
// fence that does not exist yet (no row to lock): if a concurrent Recover makes the read
// admit the write, the statement is retried, at most a few times.
//
// Advance and AdvanceBatch work in a transaction the caller owns; Apply and ApplyBatch are
// conveniences that begin and commit one. AdvanceBatch/ApplyBatch queue the fence statement
// first in the same pgx.Batch as the caller's statements, so a fenced batch costs the same
// round trips as an unfenced one (begin, one pipelined batch, commit); the caller's
// statements execute after the fence has taken its lock and are rolled back if it refused.
//
// # The handler's transaction pipelines
//
// The pgx.Tx that Apply (and pgbulk's Sink) hands fn pipelines Exec: Exec queues the statement
// and returns at once, with an empty pgconn.CommandTag and a nil error. The queued statements
// are sent in one pgx.Batch, one round trip, in the order fn issued them, at the next flush
// point: Query and QueryRow (so a read sees the writes queued before it), CopyFrom, SendBatch
// (the queued statements first), Prepare, Begin, LargeObjects, Conn, and before the commit. A
// handler of one statement per record therefore costs begin, the fence, one batch and commit,
// not a round trip per record. Over pgbulk's Sink the first Exec is a flush point too: it
// sends the fence statement and its own in one batch, at once, and returns the fence's
// refusal or its statement's error, so a zombie's handler stops at its first write as it does
// without pipelining; the statements after it are queued.
//
// Once fn calls Begin, Conn or LargeObjects, or runs an Exec without arguments or with a
// pgx.QueryExecMode (pgx sends it with the simple protocol: one string may hold several
// statements, SAVEPOINT among them), the queue is flushed and every later Exec of the
// transaction runs at once and returns its own error, which fn may recover from (ROLLBACK TO
// SAVEPOINT): statements run in the order fn issues them on the transaction, a savepoint or
// the connection. Conn and LargeObjects, which take no context, flush with Apply's.
//
// To read what a statement did (rows affected, RETURNING), use QueryRow or Query: Exec's tag
// is empty. A queued statement's error surfaces at the next flush point (a read's error, or
// Apply's), wrapped with the statement's position in the transaction and its SQL (shortened);
// errors.As still finds the *pgconn.PgError. Every later call of the transaction fails with
// it, nothing queued after it is sent, and nothing commits, whatever fn returns. A batch that
// the server refuses to prepare names the statement that failed (or, if it cannot be told,
// the handler's queued statements), not the fence.
//
// Every error Apply (and pgbulk's Sink) returns from fn's statements and the commit, however
// they were sent (a queued Exec, an Exec without arguments, Query, QueryRow, SendBatch, a
// deferred constraint failing at the commit), is permanent for the consumer
// (consumer.IsPermanent) when its SQLSTATE says the server refused the statement for its
// data: class 22 (data exception) or 23 (integrity constraint violation), but 23503 (foreign
// key), 23505 (unique) and 23P01 (exclusion), which a concurrent writer can cause and a retry
// can pass. The fence's own errors and errors that are not a *pgconn.PgError never are. The
// consumer then applies the batch one record at a time and dead-letters the record that fails
// alone. Store.Admit, and
// pgoutbox's Append, read their statements' outcomes through a query, so they work in this
// transaction as in any other.
//
// A commit that fails without an answer from the server (connection lost, context ended)
// returns [ErrCommitUnknown]: the batch may have committed. Retrying it is safe: if it had
// committed, the retry fails with fence.ErrDuplicate, which is the proof.
//
// Table names come from options and cannot be bound as parameters; they are validated
// (internal/sqlident: [A-Za-z_][A-Za-z0-9_]*, optionally schema-qualified, at most 63 bytes
// per part) and always quoted, so injection-shaped names fail at New with fence.ErrInvalid and
// accepted names are case-sensitive.
//
// # Not covered
//
//   - Failover of the database itself. With asynchronous replication a promoted standby can
//     lack the last acknowledged commits, fence advances included. The fence then regresses
//     together with the data it guards (the two stay consistent with each other), but the
//     acknowledged batches are lost, the owner's resume position moves back, and a zombie
//     whose token only a lost claim or advance had outranked is accepted again until the
//     current owner writes. A monotonic token is only as durable as the store that keeps it.
//     Use synchronous replication (synchronous_standby_names with synchronous_commit on or
//     remote_apply) where that matters, and fence a demoted primary off at the
//     infrastructure layer so that nothing keeps writing to it.
//   - Writes that bypass the fence: statements outside a fenced transaction, or in a
//     different database, are not protected.
//   - Non-transactional effects inside a refused transaction (sequence values, writes
//     through dblink or to other systems) are not rolled back.
//   - Long transactions. Every batch updates its partition's one fence row, as any hot row
//     would be updated. A transaction left open anywhere in the same database (an idle
//     session "idle in transaction") holds back cleanup of the row's dead versions, and each
//     fence statement then gets slower as they accumulate. Set
//     idle_in_transaction_session_timeout, and keep fenced transactions short: a writer
//     that holds one open also blocks the partition's next owner (that wait is the point).
//   - The fence orders writers; it does not decide ownership. Tokens come from the Kafka
//     group coordinator (see package fence).
//
// # Versioned writes
//
// [NewVersioned](table, key, version) gives the single-record optimistic write (fence.Versioned)
// over a table of yours: a version column compared and incremented in one statement.
package pgfence
