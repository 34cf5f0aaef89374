// Package consumer is Baton's single-writer runtime: a Kafka consumer-group member (franz-go)
// that owns the partitions the group coordinator assigns it and applies their records to a
// fenced sink ([fence.Sink]), exactly once into the sink, one writer per partition at a time.
//
// # Identity
//
// A partition is named by one type throughout: its fence key (fence.Key: group, topic,
// partition) reaches user code as [Batch.Key], and as the key argument of the [Factory] and of
// the [AfterCommit] function; it is the key the sink fences and the outbox appends under. Inside,
// the registry of workers is keyed by partition.ID.
//
// # Threading contract
//
// Every owned partition has exactly one goroutine. Records reach it over a channel from the
// poll loop; its handler, token and position belong to it alone (no locks around partition
// state). A [Handler] is never called concurrently for the same partition. Run owns
// every goroutine it starts and waits for all of them before it returns.
//
// # Configuration and startup
//
// [New] validates everything and starts nothing: no Kafka client, no goroutine. It reports
// every problem at once (errors.Join), each naming what is wrong: the group, the topics
// (Kafka's rules: [a-zA-Z0-9._-], at most 249 characters, not "." or ".."), a nil sink (a
// typed nil such as a nil *pgfence.Store included), no handler, no seed brokers, and the
// options ([ErrInvalidOption]). The franz-go options go through kgo.ValidateOpts; the
// ones Baton sets itself (ConsumerGroup, ShareGroup, ConsumeRegex, ConsumePartitions, the
// rebalance callbacks, the auto-commit modes and AutoCommitCallback) are refused with
// [ErrInvalidOption] naming the option and why. franz-go offers no look at an option's value
// without a client, so they are recognised by how its validation reacts to probe options;
// BlockRebalanceOnPoll leaves no trace there and is refused by Run before it joins (read with
// OptValue from a client that has no group, topics or partitions, so it connects nowhere). A
// ConsumeTopics among the options is not detectable either; New's topics replace it.
//
// [Consumer.Run] never reports success for a run that never ran. While the cluster is
// unreachable, authentication fails or the group cannot be joined, the cause is logged at
// ERROR (at once, then at most every 10s while it lasts) and counted
// (baton.consumer.client_errors); if ctx ends before the member ever joined the group (franz-go
// never called OnPartitionsAssigned, which it does after every successful join and sync), Run
// returns [ErrNotJoined] wrapping the last cause.
//
// [Consumer.Readiness] says, at any time and from any goroutine, whether the member is joined
// (assigned in its current group session, not lost since) and has claimed every partition
// assigned to it: what a readiness probe means by "joined and claimed" (examples/twin serves
// it as /readyz).
//
// # Protocol
//
//  1. Assignment (OnPartitionsAssigned): the epoch of the newly assigned partitions is read
//     once from the epoch source (classic protocol: the group generation) and kept for as
//     long as the partition is retained. Under cooperative rebalancing retained partitions
//     keep their token; reading the generation at write time would let a zombie that
//     rejoined at a higher generation pass the fence.
//  2. Claim before the first record: token = {Era: the era stored in the sink, Epoch};
//     Sink.Claim with this worker's claimant (the member's identity, its group.instance.id if
//     static and its member id otherwise, and 64 random bits, new for every worker
//     incarnation): the sink accepts a higher token, or the stored one only if
//     this claimant already holds it, atomically, so two workers presenting the same token
//     (a static member replaced without a rebalance, a recreated group back at the stored
//     generation) can never both hold it. Then the fetch position is set to the sink's
//     position + 1 with SetOffsets inside the assignment callback (franz-go lets that seek
//     win over the committed offset it is fetching). With no position, Kafka's committed
//     (or reset) offset is kept, except in a fence of a later era than 0 (moved by a topic
//     reset or a recovery): that partition is read from offset 0, its log's beginning. The callback waits for the claims up to 10s;
//     slower claims keep the partition paused until they finish.
//  3. Verify before the first write, and after every refusal: an accepted claim proves
//     only that nobody stored a higher token, and a refused one proves nothing about this
//     member. The member asks the coordinator (the epoch source's VerifyCurrent; classic
//     protocol: an OffsetCommit with its member id and generation naming the partition,
//     which a loading coordinator refuses, plus DescribeGroups showing the partition in its
//     assignment; a Heartbeat is not enough, Kafka answers it blindly while it loads the
//     group). Errors that cannot tell are retried, never taken as proof. The claim
//     decision (decide.go) then: a claimed, verified partition is applied; a member the
//     coordinator does not confirm leaves the partition alone (a zombie; WARN, counted in
//     stale_refusals); a partition it still owns at a later generation (kept across a
//     rebalance while the claim was slow) is claimed again at that generation; a refused
//     claim or write of a member the coordinator confirms is a regression (the group was
//     recreated, a static member replaced, or a non-current member raised the era): a
//     *fence.RegressionError is counted and logged at ERROR with both tokens, and, with
//     [RecoverRegressions] on, Sink.Recover moves the fence from exactly the stored token
//     to a new era held by this worker (recorded, with a reason). A Recover that loses its
//     compare-and-set (the stored token moved, or its own reply was lost) is never retried
//     as is: the worker reloads and decides again, at most a bounded number of times.
//  4. Apply: per batch (what one poll delivered, coalesced with what is already queued, split
//     into runs of at most [MaxInflightPerPartition] records), records at or below the
//     sink's position are skipped (a replay), and the rest go to Sink.Apply with the batch's
//     first and last offsets and the handler inside the fenced transaction. Then the Kafka
//     offset is marked and committed in the background (for lag and tooling only: resuming
//     trusts the sink). fence.ErrDuplicate (an applied batch seen again) is skipped;
//     fence.ErrOverlap (part of the batch was applied meanwhile) reloads the position and
//     applies only the rest. A *fence.StaleError or fence.ErrNotClaimed is never retried as
//     is: it is counted and logged with both tokens, and the claim decision of step 3 runs
//     again (a current owner recovers and goes on; only a member that is not current stops
//     the partition). Other errors are transient: the same batch is retried with bounded
//     exponential backoff ([RetryBackoff]), visible as the retries metric and WARN logs; a
//     revoke cancels the retrying.
//  5. Poison records: a handler error marked [Permanent] (named with [Batch.Fail], which
//     returns a *partition.RecordError, or found by applying one record at a time) rolls the batch back; the records before it are
//     applied, the poison record is dead-lettered in a fenced transaction that advances the
//     fence over it, and processing goes on after it. The copy (to [DeadLetterTopic],
//     default "<topic>.dlq", with the headers baton.dlq.*) is written one of two ways. With
//     [FencedDeadLetters] (outboxconsumer.DeadLetters: an append to the
//     fenced outbox, relayed by the partition's owner) it is written IN the transaction and
//     commits with the fence advance or not at all: a zombie never dead-letters, and the
//     relay's copies carry baton-* headers to deduplicate on. Otherwise it is produced to
//     Kafka from inside the transaction, after the fence check and before the commit: a
//     member whose token is already refused produces nothing, but this is at least once, not
//     fenced. A commit that fails after the produce duplicates the copy, and a member paused
//     after the fence check whose transaction the database ended meanwhile
//     (idle_in_transaction_session_timeout) can produce a copy of a record its successor
//     dead-letters too. Readers of the dead-letter topic deduplicate direct copies on
//     (baton.dlq.group, baton.dlq.topic, baton.dlq.partition, baton.dlq.offset);
//     baton.dlq.token tells whose each copy is.
//  6. Rebalance barrier: OnPartitionsRevoked cancels the partition's context, waits until its
//     in-flight batch committed or rolled back, commits the marked offsets, and only then
//     returns. OnPartitionsLost does the same without the commit. franz-go keeps heartbeating
//     while a handler runs and can revoke meanwhile: the callback waits for the handler.
//  7. Backpressure: at most [MaxInflightPerPartition] records per partition (then its fetching
//     is paused until half are done) and [MaxInflight] overall (then polling stops; one poll
//     can overshoot it by what the client had buffered). A pause
//     is cleared when its partition is revoked or lost, so a later assignment fetches again.
//  8. After each committed batch, and every idle interval, the partition's own goroutine runs
//     the [AfterCommit] hook with the partition's fence key and token ([AfterCommit] function): the
//     outbox relay runs there (consumer.AfterCommit(relay.AfterCommit(), time.Second); the
//     relay's hook is a plain func, so package outbox does not import this one), and relaying a
//     partition's side effects lives exactly where its ownership does.
//
// # Parallelism inside a partition
//
// A partition's batch is applied in one transaction, and a database transaction is one
// connection: its statements cannot run in parallel. The slow part of handling a record is
// usually not the write but a call to another service (a device gateway, a payment API). The
// [Lanes] option puts that part in a prepare function, which the consumer runs per
// record outside the transaction, in up to [Lanes] lanes per partition: one key's records on
// one lane in offset order, never two of them at once; different keys in parallel; every lane
// under the partition's single token, its ctx cancelled when the partition is revoked or lost.
// The partition's goroutine stays its only writer: it applies the contiguous prefix of
// prepared records (never past a record still in a lane) in fenced transactions, calling
// the handler with each record's result in [Batch.Prepared], so a crash or a takeover loses and
// duplicates nothing, and a zombie's lanes have no write path. Prepare itself is not fenced:
// a record prepared and not applied when the partition moves is prepared again by the next
// owner, and a zombie's lanes can keep calling until it notices, so Prepare must be
// repeatable (a read, or a call with an idempotency key); an effect that must happen once is
// appended to the outbox by the handler.
//
// Inside one handler call, work can also be spread over lanes with lanes.Lanes (package
// partition/lanes), whose Run returns the committable offset (the lowest contiguous completed
// one) if a lane fails; the writes then go into the transaction from the handler's goroutine.
//
// # Guarantees
//
// With a sink that honours the fence.Sink contract: every record of an owned partition is
// applied to the sink exactly once, in offset order (the sink refuses a batch that overlaps
// its position) (a crash between the sink commit and the
// Kafka commit loses and duplicates nothing); no write under a lower token commits after a
// higher one was accepted, so a paused or partitioned member (a zombie) cannot overwrite its
// successor's work, whatever franz-go believes; a regression is never silently accepted (the
// member must prove it is current and the recovery is recorded) and never silently stalled
// (ERROR log and metric, and recovery by default).
//
// Why RecoverRegressions defaults to on: a regression is routine (a group left empty for
// offsets.retention.minutes, seven days by default, is deleted and restarts at generation 1),
// and without recovery every partition of the group would stay unprocessed until an operator
// steps in. The recovery is safe because the member first proves with the coordinator that it
// is the current owner, the era advance is a compare-and-set on the stored token, and each
// one is recorded (Sink.Recoveries) and counted.
//
// # What it does not cover
//
//   - Side effects outside the sink's transaction (HTTP calls, emails): use the outbox.
//   - Dead letters produced directly (without [FencedDeadLetters]) are at least
//     once and may come from a zombie (see above); the dead-letter topic must exist.
//   - A partition the coordinator says this member does not own stays unprocessed (WARN,
//     stale_refusals) until franz-go revokes or loses it, or until a later group session
//     still assigns it to this member (a cooperative rebalance can give it back without a
//     revoke): its worker is then restarted and claims and proves ownership afresh. A
//     partition it does own is always processed or, after a bounded number of lost
//     recoveries or epoch re-derivations in a row, given up with a WARN and the same metric
//     (and retried the same way at the next session).
//   - A claim is verified after it was accepted: a member of an old incarnation of a deleted
//     and recreated group whose generation climbed past the stored epoch can raise the
//     stored token before its verification fails. It never writes (the claim is verified
//     before the first write), and the new owner's next write is refused, proves itself
//     current and recovers into a new era.
//   - Verification re-commits the offset Kafka holds for the partition (-1 when none): a
//     commit by this member racing it can move the committed offset back until the next
//     commit. The committed offset is for lag and tooling only; resuming trusts the sink.
//   - The watchdog judges the session by the client's clock: the coordinator's timer and this
//     process's must run at the same rate. A member whose process is paused (a GC pause, a
//     stopped VM) pauses its watchdog too; the fence is what stops its writes.
//   - The watchdog watches classic groups only: a KIP-848 group's session timeout is the
//     broker's and is not sent to the client (DESIGN.md, "What Baton does not cover").
//   - KIP-848 groups ([GroupProtocol]("consumer")) are proven on Kafka 4.3+
//     (KIP-1251's per-partition assignment epochs); the default stays the classic protocol. A
//     restarted static member of a KIP-848 group comes back at its predecessor's epoch and goes
//     through a recorded recovery, as under the classic protocol.
//
// # Watchdog
//
// franz-go learns that its group session expired only from the coordinator's answer to a
// heartbeat; a member cut off from the coordinator gets none, and its workers go on applying
// what they fetched and calling remote services from their handlers, long after the group
// gave their partitions to another member (the fence refuses their writes once the new owner
// claims, but the work and its side effects outside the sink are wasted). Run watches the
// client's requests (franz-go's HookBrokerWrite and HookBrokerE2E) and keeps the moment the
// latest answer to a Heartbeat, JoinGroup, SyncGroup, OffsetCommit or ConsumerGroupHeartbeat
// began to arrive: the coordinator refreshed the session before answering, so its deadline is
// at most that moment plus the session timeout. When that passes with no newer answer and no
// JoinGroup or SyncGroup in flight (the coordinator keeps a member that waits for a
// rebalance), every partition's context is cancelled at once and its fetching paused, before
// any next batch starts; the partitions are counted (baton.consumer.watchdog.stops) and one
// ERROR is logged. When the coordinator answers again, franz-go loses the partitions
// (OnPartitionsLost) and rejoins; a partition it still holds a heartbeat interval later was
// not lost after all, and its worker is restarted under the same claimant and epoch (its
// claim is verified with the coordinator before any write, like every claim).
//
// # Handovers
//
// Run starts the Kafka client from Baton's own defaults, which [Kafka] options override:
// the cooperative-sticky balancer and a 500ms heartbeat interval (franz-go's 3s), because the
// other members learn that one left or expired only from their next heartbeat. The session
// timeout stays franz-go's 45s: a crash takeover takes the session timeout plus about a
// heartbeat interval, a graceful one (Run's ctx cancelled: the member leaves the group) about
// half a second. 'baton bench handover' measures both on a real broker. A static member (kgo.InstanceID) does not leave the group when it stops, so a
// restart within the session timeout gets its partitions back without a rebalance, at the
// same generation: its new workers present the token the old ones claimed. Because the
// claimant they find holding it is of the same group.instance.id, this is a handover, not a
// regression: after the coordinator's proof each partition moves to a new era (which fences
// the old process, should it still be running), logged at INFO and counted in
// baton.consumer.handovers, with RecoverRegressions(false) too. A KIP-848 member that
// rejoins in place (same member id, same epoch) is handed over the same way. An equal token
// held by another identity stays a regression (ERROR).
//
// # Observability
//
// Metrics (OpenTelemetry API, [Telemetry]): baton.consumer.records.applied,
// .records.duplicates_skipped, .stale_refusals, .claims, .claims.stale, .regressions,
// .recoveries, .handovers (same-generation handovers, see Handovers), .records.dead_lettered, .rebalances, .retries, .client_errors (by
// baton.error.kind: connect, group, fetch), .watchdog.stops (partitions stopped because the
// member's session expired, see Watchdog), .topic_refusals (a partition held because its
// topic was recreated or grown, by baton.outcome), .records.lost (records deleted from the
// log before they were applied), .apply.duration (histogram) and
// .lag (gauge, from the fetch's high watermark). One span per batch ([Telemetry]) linked
// to the producers' spans found in the records' headers, with topic, partition, token and
// outcome. Logs go to [Logger] (default slog.Default(), so refusals are never silent).
package consumer
