// Package status is the operator's side of Baton: who owns which partition of a consumer
// group, with which fence token, how far behind, read from the group coordinator (franz-go's
// kadm) and from the fence and outbox stores' tables (PostgreSQL or SQLite), and the
// commands built on it: status (text, JSON, or a live HTML page), who-owns, eras (recorded
// recoveries), recover (an operator's recorded era advance) and schema/migrate. cmd/baton is
// a thin layer of flags over it.
//
// Guarantees:
//   - Reads change nothing: PostgreSQL sessions are read-only and SQLite files are opened
//     read-only ([ReadOnly]); a missing SQLite file is an error, never created.
//   - A source that cannot be reached is named with the address tried ([ErrUnreachable]) and
//     the other source is still shown; a group no source knows, a topic the brokers do not
//     know and a store without fence rows are [ErrNotFound]; bad requests are [ErrUsage].
//   - Recover checks everything before changing anything: a reason is required, every target
//     partition must have a fence row, and no live member may own one unless forced; each
//     partition is then one compare-and-set from its stored token (fence.Sink.Recover),
//     recorded with the reason and the claimant ("operator:user@host").
//   - The stores keep no record of refused (stale) writes, so status cannot count them; the
//     members' baton.consumer.stale_refusals metric does.
//
// A sharded sink (fence/shard; [Config] Shards) is read shard by shard, and the placement stored
// in the home shard says which shard each partition's line comes from: each partition is shown
// once, with its shard ([Partition] Shard); a fence found on another shard is listed beside it
// (Elsewhere: retired by a move, or a leftover), never as a second owner. A shard that cannot be
// read is named in its own [Source]; without the placement (the home shard unreadable) a line
// comes from the shard holding the partition's fence that is not retired. Recover and the topic
// operations work on one database. The single database is the same code: a placement of one
// shard.
//
// The live page ([Page]) polls both sources every interval, keeps the last minutes of lag and
// outbox backlog per partition for its charts, notes takeovers (the stored token changed) and
// recoveries, draws the ownership timeline with internal/timeline (the chaos report's drawing)
// and exports its gauges (baton.status.*) through the OpenTelemetry API; /metrics serves the
// handler it is given (telemetry.Metrics.Handler in cmd/baton). The page has no JavaScript:
// it refreshes itself with a meta refresh.
package status
