// Package sqlitefence is the SQLite fenced sink: a [fence.Sink] and [fence.KeyedSink] over
// *sql.Tx, using modernc.org/sqlite (pure Go, no cgo). It is Baton's embedded default, for
// the demo and for edge gateways, where the fence and the data live in one local file.
//
// # What it guarantees
//
// Per [fence.Key] the store keeps one row with the highest accepted token, who holds it (the
// claimant) and the last applied position, in the same database file as the caller's data. Every write to it is a conditional
// UPDATE (or, for a fence never seen, an INSERT) evaluated under SQLite's write lock, in the same
// transaction as the caller's writes, so a write under a lower token can never commit after a
// higher one was accepted, and the data never gets ahead of or behind its fence. When the
// conditional write matches no row, the store reads the row inside the same transaction and
// classifies the refusal with the rules every store of this module shares
// (internal/fencecheck), so SQLite agrees with every other sink
// about what is stale, unclaimed, duplicate, overlapping or invalid. [Store.Migrate] adds the
// claimant column to a fence table created before it existed. [Store.Recover] is a compare-and-set recorded in
// a recoveries table in the same transaction.
//
// # One writer at a time
//
// SQLite admits one write transaction per database at a time; readers continue alongside it
// in WAL mode. [Open] configures every connection to begin read-write transactions with
// BEGIN IMMEDIATE, which takes the write lock at the start: the fence check and advance can
// never interleave with another writer, and no transaction fails late trying to upgrade a read
// lock to a write lock (SQLITE_BUSY_SNAPSHOT, which no busy timeout can wait out). The store's
// own write transactions (Claim, Apply, Recover) are also serialized within the process, so the
// lock passes straight to the next in-process writer instead of being polled for. Throughput
// is therefore that of one writer: batch records into few transactions ([Store.Apply] per poll
// batch), since the fence costs one extra row update per transaction, not per record, and
// write each batch with few statements: package sqlitebulk (fence/sqlitefence/sqlitebulk) is
// the fast write path, prepared multi-row upserts merged per key inside Apply.
//
// # Busy database
//
// Another connection, possibly in another process on the same machine, may hold the write lock.
// Each store operation waits for it up to [BusyTimeout] (default 5s): SQLite's busy_timeout
// waits at the lock, and the store's own transactions retry SQLITE_BUSY until the timeout has
// elapsed since the call began. Past that the operation fails with [ErrBusy] (the driver's
// error stays in the chain) and nothing is committed; a busy error is never swallowed. Apply
// retries only before it runs the caller's function, so that function runs at most once per
// call. [Store.Advance] and [Store.Admit] run in the caller's transaction and cannot retry it:
// they return ErrBusy and the caller rolls back.
//
// Waiting for the lock is not fair between processes: SQLite's busy handler polls with growing
// sleeps, so a process whose writers keep the lock busy can hold another process off, and that
// one then sees ErrBusy. Give each fence key one writing process, as Baton's partition
// ownership does, and treat ErrBusy as "retry later".
//
// # Durability
//
// [Open] uses journal_mode=WAL with synchronous=FULL by default: each commit fsyncs the
// write-ahead log before it returns, so a committed fence and its data survive a process crash,
// an OS crash and a power loss. [SyncNormal] skips that fsync (the WAL is synced at
// checkpoints): commits still survive a process crash, but a power loss or OS crash can roll
// back the last commits. The database stays consistent, and because fence and data are
// committed together they are rolled back together: the stored position falls back with the
// data and the lost records are re-applied from Kafka (a Kafka offset commit made meanwhile is
// harmless: the file's position is authoritative). What breaks is anything done outside the
// file on the strength of a lost commit, such as an acknowledgement sent. FULL is the default
// because a fence exists to make "committed" mean committed; on an edge gateway with a
// battery-backed or power-loss-protected disk, NORMAL is a reasonable trade (see the
// benchmarks in bench_test.go).
//
// # Limits
//
//   - The file is the fence's durable home: deleting or restoring it from a backup loses or
//     rewinds every fence in it, which lets a deposed writer's token be accepted again.
//     Restore a backup only with all writers stopped, and follow it with a fresh claim by the
//     current owners (their epochs are higher than any in the backup).
//   - One host. SQLite's locking depends on the host's file locks; WAL mode additionally needs
//     shared memory between the connections. Do not put the file on a network file system or
//     share it between hosts: writers there are not serialized and the fence guarantees nothing.
//     Several processes on one host are fine.
//   - [New] takes a *sql.DB opened by the caller with modernc.org/sqlite and changes none of its
//     settings; see New for the DSN that gives the guarantees above.
//
// # Tables
//
// [Table] names the fence table (default "baton_fences", as in pgfence); the store also creates
// name_recoveries, name_recoveries_idx and name_keyed (pgfence's names, plus the index).
//
// As in pgfence, [New] does no I/O: [Store.Migrate] creates the tables (CREATE ... IF NOT
// EXISTS, idempotent, in one write transaction), and [Store.Schema] returns the same DDL for
// deployments that own their migrations. [Open], which opens a file the store owns, runs
// Migrate itself.
//
// # Versioned writes
//
// [NewVersioned](table, key, version) gives the single-record optimistic write (fence.Versioned)
// over a table of yours: a version column compared and incremented in one statement.
package sqlitefence
