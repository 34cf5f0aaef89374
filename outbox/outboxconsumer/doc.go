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
//     checks their shard count against the one acknowledged with the fences (recording the
//     application's count if none is stored; a relay's first claim records the broker's
//     count over a record without a topic ID). Growing the coordination topic holds every
//     shard (an idle one before its next AfterCommit run, within 5s) until the growth is
//     acknowledged. AppendCurrent takes a shard key and checks no count: only PrepareShards
//     does, at the appender's start.
//
// # Changing the shard count
//
// Drain, then change (why: DESIGN.md, "Changing the standalone relay's shard count"):
//
//  1. Stop every appender.
//  2. Wait until baton status -group RELAYGROUP shows outbox backlog 0 on every shard.
//  3. Add partitions to the coordination topic.
//  4. baton topics ack -group RELAYGROUP -topic COORD -reason "..."
//  5. Start the appenders with the new count.
//
// Rows appended while the shards are held are relayed afterwards, in their shard's order.
// Shards are never removed: PrepareShards refuses a count below the acknowledged one.
//
// The relay of a consumer's own outbox needs no glue: consumer.AfterCommit(relay.AfterCommit(),
// interval) runs outbox.Relay.Flush in each partition's goroutine under its token.
package outboxconsumer
