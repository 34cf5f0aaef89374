// Package lincheck holds the linearizability check of the fence stores; it has no API, only
// tests.
//
// The tests record concurrent histories of Claim, Apply (Advance in a transaction), Recover
// and Load against the real stores (fence/pgfence on the PostgreSQL of BATON_POSTGRES_URL,
// fence/sqlitefence on a file with two handles, fence/redisfence on a redis-server of the
// test's own), while faults happen: PostgreSQL backends of the test are terminated with
// pg_terminate_backend, the database is restarted in the middle (only when
// BATON_LINCHECK_PG_RESTART names the command that restarts a PRIVATE instance; never the
// shared one), SQLite calls are cancelled mid-statement and a handle is closed and reopened,
// and the Redis server is killed (SIGKILL) and restarted over its append-only file. Each
// history is checked with porcupine (github.com/anishathalye/porcupine, the checker of etcd's
// robustness tests) against a sequential model of one fence whose steps are the rule
// functions of internal/fencecheck: the stores must behave as if every call took effect
// atomically at one instant between its call and its return. A call whose outcome the client
// cannot know (its connection was killed while the statement or the commit was in flight) is
// recorded with an unknown outcome: it may have taken effect at any instant after its call,
// or not at all.
package lincheck
