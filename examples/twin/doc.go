// Command twin is Baton's digital-twin pipeline as a readable program, on embedded defaults
// (Kafka in-process with kfake, the store an SQLite file in a temporary directory), or on real
// services with -brokers and -postgres:
//
//   - simulated devices send reported and desired temperatures, keyed by device id;
//
//   - a consumer group folds them into a twins table (reported, desired, version) inside
//     the fenced transaction, with one set-based upsert per batch (the fast path: pgbulk on
//     PostgreSQL, sqlitebulk on SQLite), and for each desired change appends a command to
//     the outbox in the same transaction; the owner relays the outbox to the commands topic;
//
//   - a device gateway consumes the commands through an inbox and applies each exactly once;
//
//   - one member is frozen with a batch in hand past its session, the other takes over, and the
//     frozen one's write is refused as stale when it wakes.
//
//     go run ./examples/twin
//     go run ./examples/twin -brokers 127.0.0.1:19092 -postgres postgres://...
//
// With -redis ADDR the twins are hashes in Redis (fence/redisfence) and each device's commands
// a stream of its own, written in the same fenced script as the twin: there is no outbox on
// Redis, so no relay and no gateway (README.md says why this is what a user of Redis wants).
//
// The same program is also the member that deploy/compose and deploy/k8s run: `twin -serve
// ADDR` is one long-running member of the twins group (consumer and relay) serving /metrics,
// /healthz and /readyz ("joined and claimed", from consumer.Consumer.Readiness); `twin
// -migrate` creates its tables and grants the runtime role. usage.txt is `twin -h`.
package main
