// Package outbox carries side effects of fenced state changes to Kafka and into downstream
// stores without loss, reordering or double effects: a fenced transactional outbox, a fenced
// relay and an inbox.
//
//	owner of source partition p (token T)              receiver "billing"
//	────────────────────────────────────              ───────────────────────────────
//	BEGIN                                              BEGIN
//	  fence Advance(p, T, offset)  ── row lock         Inbox.Admit(tx, rec): KeyedSink.Admit
//	  UPDATE accounts ...          (state change)        scope = "billing|" + baton-source
//	  Append(tx, p, T, msgs) ── checks fence(p)==T,        + "|" + rec.Topic/rec.Partition
//	                                                     id    = record key
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
// delivered rows never lets a sequence be reused. Bad input ([ErrTooLarge], [ErrInvalid]: no
// topic, a reserved or malformed header, ...) is refused before any statement: a row the
// broker would refuse for ever would block its partition's relay.
//
// Authors of a store: outbox/outboxtest is the conformance suite that proves the rules above;
// pgoutbox and sqliteoutbox share their checks and encodings in an internal package.
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
// # Dead letters of a consumer's poison records
//
// A Baton consumer's dead-letter copy of a poison record is an outbox row too with the
// consumer option outboxconsumer.DeadLetters: appended under the partition's token in the
// transaction that advances the fence over the record, relayed to the dead-letter topic like
// any row, with the consumer's baton.dlq.* headers and the relay's baton-* headers. A zombie's
// copy is written in a transaction that cannot commit, so only owners dead-letter, and a
// re-published copy is deduplicated by an [Inbox] or on baton-idempotency-key.
//
// # Undeliverable rows
//
// Rows are delivered in sequence order, so a row the broker refuses for ever would hold up
// every row behind it. Three things bound that. First, each Flush returns within
// [FlushTimeout] (default 5s) with [ErrFlushTimeout]: the acknowledged prefix is marked, the
// rest stays pending, and the consumer goes on with its next batch, so a stuck row delays a
// partition's processing by at most that much per batch. (A produce request already sent is
// waited for by franz-go, which cannot fail an idempotent batch in flight; that adds up to
// the client's request timeout to a flush on a broker that stops answering.) Second, the relay
// dead-letters a row that can never be delivered: Store.DeadLetter, a conditional write under
// the fence like MarkDelivered (only the current token, only the first pending row), keeps the
// row with its reason in the store's dead-letter table and moves past it. Third, the stuck row
// is visible: baton.outbox.oldest_pending_age rises, and baton.outbox.dead_lettered counts
// what was given up, by reason.
//
// Which errors are permanent for a row, conservatively (everything else is retried for ever):
//
//   - kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidRecord: the broker refuses
//     the record itself (a topic max.message.bytes below the append check, a keyless record
//     to a compacted topic). Kafka refuses whole record batches, so a small row sharing a
//     batch with a large one gets the same error: the relay dead-letters a row only after it
//     was produced ALONE and refused again with the same error.
//   - A missing destination topic (kerr.UnknownTopicOrPartition, or a produce that timed out
//     while franz-go waited for the topic): only after a metadata request confirmed the topic
//     missing at each of at least 3 flushes spanning [GiveUpAfter] (default 10 minutes), so a
//     topic being created, or a metadata answer from a lagging broker, does not lose a row.
//   - kerr.TopicAuthorizationFailed: after [GiveUpAfter] as well, since an ACL may be granted.
//
// Not permanent: ClusterAuthorizationFailed (every row of the client fails: dead-lettering
// would empty the outbox), broker or network errors, timeouts with the topic present. The
// GiveUpAfter clock is the relay's memory, so a restart or a takeover starts it again; that
// only delays a dead letter. A dead-lettered row is not retried: an operator reads it from the
// dead-letter table (pgoutbox/sqliteoutbox Store.DeadLetters, or the table name+"_dead_letters")
// and re-appends its message once the cause is fixed, or drops it; Cleanup never deletes it.
// Receivers see a gap in the source's sequence; the inbox does not need sequences to be
// contiguous. A row that failed a flush is produced alone first at the next flush, so the rows
// behind a stuck row are not re-published at every flush.
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
// (shard, record key). The shard count is the coordination topic's partition count, recorded
// with the shard fences; changing it moves entities between shards, so every shard is held
// when the topic grows and PrepareShards refuses another count until an operator drains the
// shards and acknowledges it (baton topics ack; DESIGN.md, "Changing the standalone relay's
// shard count"). The coordination group commits no offsets, so Kafka deletes it once it
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
//     the receiver's write, per (receiver, source partition, destination topic and partition,
//     record key), in (token, seq) order, so re-published copies and zombie records are dropped.
//
// Best effort: side effects with no token check (third-party APIs, devices, email). They get the
// record's baton-idempotency-key ("group/topic/partition/seq", or the key given in
// [Message.IdempotencyKey]); whether a retried call is deduplicated is up to the third party.
// Receivers that consume without the inbox see every record at least once.
//
// # Record headers
//
// Go receivers read a record's stamps with [ParseEnvelope]. Receivers in other languages read
// the headers the relay sets on every record: baton-token (the appending owner's fence token,
// "era.epoch"), baton-seq (the per-source-partition sequence, decimal), baton-source (the
// source fence key, "group/topic/partition"), baton-idempotency-key, with SigningKeys
// baton-signature (see below), and the W3C traceparent and tracestate of the appending
// transaction when it had a span.
//
// # Admission scope
//
// Sequences rise per source partition across every destination topic, but Kafka orders records
// only within one partition. So the inbox scopes each admission by the destination topic and
// partition the record was read from (kgo.Record.Topic and Partition), not only by the source
// partition and key: within that scope the records of one source reach the receiver in the
// relay's produce order (seq order, re-publishes starting again from the first unmarked row),
// which is the order the (token, seq) comparison assumes, whatever the receiver reads in
// between. With the source and key alone, a receiver reading topics A and B with one inbox
// that read B's seq 8 before A's seq 7 dropped A's record as a duplicate although it was never
// applied. The alternative, checking that one inbox only ever sees one destination partition,
// would refuse legitimate receivers (a consumer of several topics, or of a topic whose key
// moves after the topic grows) without making the assumption hold; the scope makes it hold by
// construction.
//
// The price: a record is deduplicated only against copies in the same destination partition.
// The relay's copies of a row go to the partition its key hashes to, so they meet as long as
// the destination's partition count and the relay client's partitioner (franz-go's default
// hashes the key) stay the same. If a destination topic gains partitions while copies are in
// flight (published but not yet marked: at most one relay batch per source partition, plus a
// deposed relay's), a copy may land in the key's new partition and be applied again, and the
// key's older records still unread in the old partition are applied after its newer ones.
// Grow a destination topic only after its receivers have caught up and its relays are idle
// (every source's backlog 0), exactly like a source topic (drain, then grow).
//
// Upgrading a receiver from the old scope (receiver "|" source, without the destination): admissions
// stored under the old scope are no longer consulted, so the first record of each key after
// the upgrade is admitted. A copy of a record the receiver applied BEFORE the upgrade that it
// reads again AFTER it is therefore applied twice. Such copies exist only (a) when a receiver
// that is not a Baton consumer resumes from a committed offset older than what it applied (a
// Baton consumer receiver, outboxconsumer.Handler, skips those by its fence position), and (b)
// when a relay re-publishes (a crash between produce and mark: at most one batch per source
// partition) or a deposed relay publishes late. To upgrade with no such copy in flight, stop
// the receiver after its lag on the destination topics is 0 (and, for (a), after it committed
// its offsets), wait until every source's outbox backlog is 0, then start the new version. The
// old admissions are then dead weight: once the new version runs, delete the keyed-fence rows
// (pgfence's and sqlitefence's table "baton_fences_keyed" by default) whose scope is of the old
// form, "receiver|group/topic/partition", without the "|topic/partition" suffix of the read
// position; in PostgreSQL: DELETE FROM baton_fences_keyed WHERE scope LIKE 'billing|%' AND
// scope !~ '\|[A-Za-z0-9._-]+/[0-9]+$'.
//
// # Observability
//
// Metrics (OTel API; providers from options, default the globals): baton.outbox.backlog (gauge
// per source partition, recorded by Flush), baton.outbox.oldest_pending_age (gauge per source
// partition: seconds since the append of its oldest undelivered row, 0 when none; a row that
// cannot be delivered shows as an age that keeps rising), baton.outbox.delivered,
// baton.outbox.dead_lettered (counter per source partition and destination topic, with the
// reason label), baton.outbox.commit_to_ack (seconds from the row's append, store clock, to its
// acknowledgement, relay clock), baton.inbox.admitted and baton.inbox.drops{reason=duplicate|stale}. Append captures the W3C
// trace context of its ctx; the relay starts a producer span as a child of it and injects that
// into the record; Inbox.Admit starts a consumer span as a child of the record's. Both come from
// the tracer provider given to [NewRelay] or [NewInbox] with [Telemetry] (default the
// global).
package outbox
