// Package chaos runs your own workload under Baton's chaos harness and judges it.
//
// A [Workload] names its topics, creates its tables, returns the consumers every worker
// process runs (a [Handler] per partition and owner, writing in the [Tx] Baton fences), produces
// its input and judges its invariants over the database afterwards. [Main], called from the
// program's main, is the whole harness: it starts worker processes (the program re-executes
// itself, so there is no separate worker binary), produces the input while it freezes, kills
// and restarts workers, waits until everything is processed and prints the verdict: PASS or
// FAIL, the harness's invariants (no batch committed under a stale token, no offsets applied
// twice, no frozen worker writing after its takeover) and the workload's own.
//
// Services come from flags or the environment: -brokers ($BATON_KAFKA_BROKERS) and -postgres
// ($BATON_POSTGRES_URL); without them the run uses an embedded Kafka (kfake) and an SQLite
// file. -unfenced runs the same handlers on Kafka's assignment alone, with no fence: the
// checker should then fail the run, which shows the invariants can fail.
package chaos
