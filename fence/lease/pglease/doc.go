// Package pglease is a PostgreSQL token source for fence/lease: a session advisory lock plus a
// counter row incremented under it, in the same database, as the fencing token.
//
// # How it works
//
// Each Acquire opens its own session, sets idle_session_timeout to the [TTL] (PostgreSQL 14 or
// later), waits for pg_advisory_lock(key), and then, holding the lock, increments the
// resource's row in the counter table (INSERT ... ON CONFLICT DO UPDATE SET counter = counter +
// 1 RETURNING counter, in autocommit): the committed value is the token. The lock key is the
// 64-bit FNV-1a hash of "baton/pglease/" + group + "\x00" + resource, as a bigint: operators
// find the holder in pg_locks (objid is its low 32 bits, classid its high 32 bits).
// The session then pings every TTL/3. A holder that stops pinging (paused, cut off) has its
// session terminated by the server after the TTL, which frees the lock: idle_session_timeout
// is what turns a session lock into a lease. The lease's context ends when a ping fails (the
// session was terminated or the connection broke). Release closes the session.
//
// Call [Source.Migrate] once to create the counter table. Connect directly or through a
// session-mode pooler: a transaction-mode pooler (PgBouncer pool_mode=transaction) does not
// keep a session, and a session lock means nothing there.
//
// # Why the token is safe
//
// Counter values are issued only by the lock holder, one per acquisition, and committed before
// the lease is handed out: the next holder gets the lock only after this session ended, and
// its increment reads our committed value, so its token is strictly higher. Each grant's
// identity (the claimant the sink stores with its token) is the backend pid and 128 random
// bits: when the counter goes back (below) and re-issues a token, pids repeat too (a restored
// or promoted server numbers its backends afresh), and the pid alone would make two holders of
// one token one claimant; with the suffix the second is refused as stale. Two resources
// whose lock keys collide (64-bit FNV) share a lock, which costs concurrency but not safety:
// their counters are separate rows.
//
// # What the token survives
//
//   - Restart, crash of the server: the counter row is committed (with synchronous_commit on,
//     flushed) before the token is used; the restarted server continues above it (TestRestart).
//     The restart ends every session, so every holder learns it lost its lease.
//   - Failover to a replica: advisory locks are not replicated, so the promoted primary has no
//     lock and the next Acquire gets it at once; the counter row is replicated. With
//     asynchronous replication, the promoted replica may lack the last acknowledged commits:
//     its counter is behind, the next holders get tokens the sink already saw, and the sink
//     refuses them as stale (a regression is never accepted) until an operator recovers the
//     keys with fence.Sink.Recover and raises [Era]. A deposed primary that is still reachable
//     (split brain) grants its own locks and counters, and a sink in that same database
//     accepts them: fence it off (STONITH) before promoting. With synchronous replication
//     (synchronous_standby_names, synchronous_commit on or remote_apply) the counter survives
//     the failover.
//   - Restore from a backup or point-in-time recovery: the counter goes back, as above.
//
// # Latency
//
// BenchmarkAcquireRelease (uncontended Acquire + Release: connect with SCRAM authentication,
// set_config, lock, counter upsert, close) against the local PostgreSQL 15 from
// deploy/local/postgres.sh on the 2-core development machine: 12.3 ms/op (200 iterations);
// most of it is the new connection.
package pglease
