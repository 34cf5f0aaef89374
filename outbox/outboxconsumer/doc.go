// Package outboxconsumer is the glue between a Baton consumer and the fenced outbox: the pieces
// that need both packages, so that outbox, outbox/pgoutbox and outbox/sqliteoutbox never import
// the consumer (the import direction is checked by internal/archtest).
//
//   - [Handler] wraps a consumer.Handler with an outbox.Inbox: every record of a batch is
//     admitted inside the batch's fenced transaction and only admitted records reach the
//     wrapped handler; duplicates and stale records are dropped and counted, a record without
//     Baton's headers or key is dead-lettered as a poison record. With it, [AdmitDeadLetters]
//     admits a record in the transaction that dead-letters it: a message is applied once or
//     dead-lettered once, never both and never twice, whatever copies the relay re-publishes.
//   - [DeadLetters] is the consumer option that dead-letters a poison record through the
//     fenced outbox (consumer.FencedDeadLetters): the copy is appended in the
//     transaction that advances the fence over the record and relayed by the partition's
//     owner, so a zombie whose transaction the database ended never dead-letters, where a
//     direct produce would.
//   - [NewStandaloneRelay] is a Baton consumer on a coordination topic whose partitions are
//     relay shards: the member owning shard i claims [ShardKey](group, topic, i) and flushes
//     that shard's outbox rows under its token, so a takeover fences the old relay exactly as
//     for a consumer's own outbox. Applications append to a shard with outbox.AppendCurrent
//     and make the shards writable before any relay runs with [PrepareShards], which also
//     checks their shard count against the one acknowledged with the fences. Growing the
//     coordination topic holds every shard until the growth is acknowledged (drain the shards
//     first: DESIGN.md, "Changing the standalone relay's shard count").
//
// The relay of a consumer's own outbox needs no glue: consumer.AfterCommit(relay.AfterCommit(),
// interval) runs outbox.Relay.Flush in each partition's goroutine under its token.
package outboxconsumer
