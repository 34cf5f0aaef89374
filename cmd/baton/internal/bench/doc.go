// Package bench is the harness behind 'baton bench': the same job, folding keyed records
// from a real Kafka topic into PostgreSQL (or SQLite) exactly once with per-key order kept,
// done by several designs side by side in one run, each in a process of its own, in rotating
// order (every other round backwards), every run's output checked.
//
// The package holds what every design shares and needs nothing of Baton's library: the job a
// worker process receives ([Job]) and the report it prints ([Report]), the fold every design
// writes and the check that proves it exact ([FoldUpsert], [Check]), the worker side
// ([Serve]) and the run ([Run]), and the designs that do not use Baton (one row per
// transaction, a Redis lock per key, the database's ceiling, the broker's read ceiling). Baton's designs are
// registered by cmd/baton, which sits above the library; watermill's live in the nested
// module cmd/baton/internal/bench/peers (its own go.mod), so that watermill, Sarama and their
// dependencies never enter the module graph of Baton's library: a user who requires
// github.com/batonhq/baton does not download them, and 'go test ./...' does not build them.
//
// The fold: table fold(key, n, total, first, last, bad); the i-th record of a key carries
// the value i (1, 2, 3, ...). Each record adds 1 to n and its value to total, sets last, and
// adds 1 to bad when it does not follow last (a record lost, doubled or out of order). The
// check requires, for every key, n = per-key count, total = n(n+1)/2, first = 1, last = n
// and bad = 0.
package bench
