// Package leasetest is the real-service suite every token source of fence/lease runs: a zombie
// holder frozen with SIGSTOP past its lease, and a lease lost while a write is in flight, each
// with two holders in separate processes writing through a real fenced sink.
//
// The holders are the test binary itself, re-executed as helper processes: a source's test
// package calls [Child] from TestMain when [IsChild] reports that it runs as one, and the test
// calls [Zombie] and [InFlight]. The parent drives each helper over its stdin with one command
// per line and reads one result line per command from its stdout, so the test knows exactly
// what each holder attempted and what the sink answered.
//
// The sink is PostgreSQL (fence/pgfence, in a fresh schema) when BATON_POSTGRES_URL is set,
// else SQLite (fence/sqlitefence, in a file under the test's temporary directory, shared by the
// processes). The caller's data is one table, lease_data(resource, value), written in the same
// transaction as the fence.
//
// What the cases prove:
//
//   - Zombie: holder A acquires, claims and writes; A is frozen (SIGSTOP); B acquires once the
//     service has expired A, claims and writes; A is thawed (SIGCONT) and writes under its old
//     token straight through the sink (as code paused between its lease check and its write
//     does). The sink must refuse it with a *fence.StaleError naming B's token as the stored
//     one (which only the database knew: proof the write reached it), the write through
//     lease.Apply must fail too, A must eventually learn that its lease ended, and the table
//     must hold B's value.
//   - InFlight: A's lease.Apply is inside its function, its row written but not committed,
//     when the service ends A's grant (the kill function: etcd revokes the lease, ZooKeeper
//     deletes the node, PostgreSQL terminates the backend). The write must fail with lease.ErrLost
//     and never commit; B then acquires and writes.
//
// Every wait is bounded (each helper command by 15s, a frozen helper is thawed and killed at
// cleanup), so a broken source fails the test in seconds instead of hanging it.
//
// The suite's own tests run it against a small lease service in a shared directory, and
// against broken variants of it that each case must catch: a source whose successor's token is
// not higher, and one that never reports a lost lease.
package leasetest
