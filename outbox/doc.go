// Package outbox carries side effects of fenced state changes to Kafka and into downstream
// stores without loss, reordering or double effects: a fenced transactional outbox, a fenced
// relay and an inbox.
//
//	owner of source partition p (token T)              receiver "billing"
//	────────────────────────────────────              ───────────────────────────────
//	BEGIN                                              BEGIN
//	  fence Advance(p, T, offset)  ── row lock         Inbox.Admit(tx, rec): KeyedSink.Admit
//	  UPDATE accounts ...          (state change)        scope = "billing|" + baton-source
//	  Append(tx, p, T, msgs) ── checks fence(p)==T,      id    = record key
//	    seq := cursor(p).last_seq + 1 ...                (T, seq) > stored? Admitted
//	    INSERT outbox rows (p, seq, T, traceparent)                 else Duplicate / Stale
//	COMMIT ── state + rows, or neither                 apply effect if Admitted
//	       │                                           COMMIT ── admission + effect, or neither
//	       ▼                                                  ▲
//	Relay.Flush(p, T)  (p's owner, after each batch)          │
//	  Pending rows of p, seq order ──► kgo.Produce ──► Kafka topic ── headers: baton-token,
//	  wait for every ack                                       baton-seq, baton-source,
//	  MarkDelivered(p, T, last seq): UPDATE cursor             baton-idempotency-key,
//	    only if fence(p) still stores exactly T                traceparent (continues the
//	    (FOR SHARE: a takeover's Claim waits or wins)          state change's trace)
//
// # Appending
//
// A store's Append (pgoutbox.Store.Append for a pgx.Tx, sqliteoutbox.Store.Append for a *sql.Tx)
// runs in the caller's transaction after the fence Advance, so the rows commit with the state
// change or not at all. Append checks the fence itself in the same statement that allocates the
// sequences: if the fence row does not store exactly the presented token it writes nothing and
// fails with *fence.StaleError (a higher token: the caller is a zombie) or [ErrUnfenced]. A
// caller that forgot Advance is therefore still fenced. The sequence comes from a per-partition
// cursor row updated in the same transaction; its row lock orders appenders, so sequences are
// gap-free in commit order, and since the cursor is kept apart from the rows, deleting
// delivered rows never lets a sequence be reused. Bad input ([ErrNoTopic], [ErrTooLarge],
// [ErrInvalidHeader], [ErrInvalid]) is refused before any statement: a row the broker would
// refuse for ever would block its partition's relay.
//
// Authors of a store: outbox/outboxstore holds the checks and encodings every store shares
// (ValidateAppend, MarshalHeaders, UnmarshalHeaders, TraceContext), and outbox/outboxtest is
// the conformance suite that proves the rules above.
//
// # Relaying
//
// The relay of source partition p runs under p's ownership: the owner's worker calls
// [Relay.Flush](p, T) after each committed batch, through the hook [Relay.AfterCommit]
// installed with consumer.AfterCommit. Flush reads pending rows only while the fence stores T, produces a batch, waits for all acknowledgements and then marks the batch delivered
// with a conditional write under p's fence. After a takeover the old owner can neither mark nor
// skip rows; it may still publish rows it read before the takeover, but those carry their
// ORIGINAL token and sequence, exactly like the new owner's copies, so the inbox drops them as
// duplicates. If Kafka is unavailable the rows stay pending and Flush returns an error; the next
// Flush re-publishes from the first unmarked row. franz-go's idempotent producer keeps each
// destination partition in produce order and fails every buffered record of a partition after
// one fails, so what reached the broker is a prefix and a retry never lets an older record
// overtake a newer one of the same key. Delivery is at least once; a crash between produce and
// mark re-publishes at most one batch.
//
// Applications that append outside a Baton consumer (an HTTP service writing state and outbox
// rows in one transaction) use a standalone relay (outboxconsumer.NewStandaloneRelay): a Baton
// consumer group on a small coordination topic of N partitions, the shards, to which nothing is
// produced. The coordinator assigns each shard to one member, which claims
// outboxconsumer.ShardKey(group, topic, shard) and flushes that shard's rows on assignment and
// every idle interval under its token; a takeover fences the old member exactly like a
// consumer's. The application owns nothing: it appends with [AppendCurrent], which stamps the
// rows with the token the shard's fence stores now (loaded, then checked again by Append in the
// same statement; a claim in between is retried). A shard with no fence row refuses appends, so
// the application calls outboxconsumer.PrepareShards once at startup: it claims each unclaimed
// shard with the zero token, which any relay outranks, and rows appended under it wait for the
// first relay. Put all of an entity's messages in one shard: order and deduplication are per
// (shard, record key). The coordination group commits no offsets, so Kafka deletes it once it
// stays empty past an offsets cleanup (offsets.retention.check.interval.ms, 10 minutes by
// default); its generation then restarts at 1, and the next relay proves it is current and
// recovers each shard into a new era (recorded, logged as a regression): expected after a long
// full stop, not a fault.
//
// # Authenticating the source
//
// By default the inbox trusts the topic: any record with well-formed baton headers is judged by
// its token and sequence, so only the relay's principal may have Write on a topic an inbox reads
// (SECURITY.md). Where that ACL is not the boundary, give the relays and the inbox the same
// [SigningKeys]: the relay signs each record (HMAC-SHA256, header baton-signature) and the inbox
// refuses unsigned, forged or altered records with [ErrBadSignature] before touching its keyed
// fence, so a forged token cannot shadow a key's genuine records.
//
// # Layering
//
// This package, pgoutbox and sqliteoutbox do not import the consumer: [Relay.AfterCommit]
// returns a plain func that consumer.AfterCommit accepts. The glue that needs both (the inbox
// wrapper of a consumer.Handler, the standalone relay) is in package outbox/outboxconsumer.
//
// # What is exactly once
//
//   - The state change and its outbox rows: one transaction.
//   - Effects applied by receivers through an [Inbox]: the admission is stored atomically with
//     the receiver's write, per (receiver, source partition, record key), in (token, seq) order,
//     so re-published copies and zombie records are dropped.
//
// Best effort: side effects with no token check (third-party APIs, devices, email). They get the
// record's baton-idempotency-key ("group/topic/partition/seq", or the key given in
// [Message.IdempotencyKey]); whether a retried call is deduplicated is up to the third party.
// Receivers that consume without the inbox see every record at least once.
//
// # Observability
//
// Metrics (OTel API; providers from options, default the globals): baton.outbox.backlog (gauge
// per source partition, recorded by Flush), baton.outbox.delivered, baton.outbox.commit_to_ack
// (seconds from the row's append, store clock, to its acknowledgement, relay clock),
// baton.inbox.admitted and baton.inbox.drops{reason=duplicate|stale}. Append captures the W3C
// trace context of its ctx; the relay starts a producer span as a child of it and injects that
// into the record; Inbox.Admit starts a consumer span as a child of the record's.
package outbox
