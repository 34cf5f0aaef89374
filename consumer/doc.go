// Package consumer is Baton's single-writer runtime: a Kafka consumer-group member (franz-go)
// that owns the partitions the group coordinator assigns it and applies their records to a
// fenced sink ([fence.Sink]), exactly once into the sink, one writer per partition at a time.
//
// The protocol behind it (the token, the claim, the coordinator's proof of ownership, eras and
// recovery, topic identity) and why it is safe are explained in DESIGN.md at the root of the
// repository; this documentation says what a user of the package needs.
//
// # Identity
//
// A partition is named by one type throughout: its fence key (fence.Key: group, topic,
// partition) reaches user code as [Batch.Key], and as the key argument of the [Factory] and of
// the [AfterCommit] function; it is the key the sink fences and the outbox appends under.
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
// the rest New reads with OptValue from a client that has no group, topics or partitions, so
// it connects nowhere: BlockRebalanceOnPoll is refused, and so is a ConsumeResetOffset or
// ConsumeStartOffset other than the log start (kgo.NewOffset().AtStart(), Baton's default): a
// resume point below the log start, or a partition with no position, must not skip records
// still in the log. A ConsumeTopics among the options is not detectable either; New's topics
// replace it.
//
// [Consumer.Run] never reports success for a run that never ran. While the cluster is
// unreachable, authentication fails or the group cannot be joined, the cause is logged at
// ERROR (at once, then at most every 10s while it lasts) and counted
// (baton.consumer.client_errors); if ctx ends before the member ever joined the group (franz-go
// never called OnPartitionsAssigned, which it does after every successful join and sync), Run
// returns [ErrNotJoined] wrapping the last cause. A member that cannot use its sink (a
// partition's claim failing for 30s with only errors no retry fixes: a wrong password, a
// missing fence table or grant) leaves the group and Run returns the cause, so that its
// partitions move to a member that can claim them; a database outage never makes it leave,
// and only PostgreSQL's errors (SQLSTATE) are judged so: a sqlitefence or redisfence member
// retries for as long as it runs ([Consumer.Run]).
//
// [Consumer.Readiness] says, at any time and from any goroutine, whether the member is joined
// (assigned in its current group session, not lost since) and has claimed every partition
// assigned to it: what a readiness probe means by "joined and claimed" (examples/twin serves
// it as /readyz).
//
// # What the runtime does with a partition
//
//  1. On assignment it claims the partition's fence in the sink and has the group coordinator
//     confirm that this member owns it, then seeks to the sink's position + 1: resuming trusts
//     the sink, and Kafka's committed offset serves lag and tooling. The assignment callback
//     waits for the claims up to 10s; slower claims keep the partition paused until
//     they finish.
//  2. Each batch (what one poll delivered, coalesced with what is queued, at most
//     [MaxInflightPerPartition] records) goes to Sink.Apply with the handler inside the fenced
//     transaction; then the Kafka offset is marked and committed in the background, at most
//     one commit in flight and 100ms apart, so the group's committed offsets (what
//     kafka-consumer-groups, Burrow or KEDA read as its lag) follow the sink within about
//     that, not franz-go's 5s auto-commit interval. A replayed batch is skipped; a partly applied one is applied from the sink's position on. Other
//     errors are transient: the same batch is retried with bounded exponential backoff
//     ([RetryBackoff]; the retries metric, WARN logs, ERROR once a step has kept failing for
//     30s or one call of it has not returned for 30s, and a hint naming baton migrate when a
//     table of the fence store is missing), never reordered or skipped.
//     The handler's writes need not be batched by hand: pgfence's transaction (and pgbulk's)
//     queues each Exec and sends the queued statements in one round trip at the next read or
//     before the commit, so their errors surface there, naming the statement (see package
//     pgfence).
//  3. A write refused by the fence is never retried as is: the member asks the coordinator. A
//     member that is not the owner (a zombie) leaves the partition alone (WARN, counted in
//     stale_refusals); an owner whose generation went backwards (a deleted or recreated group)
//     gets a *fence.RegressionError (ERROR, metric) and, with [RecoverRegressions] on (the
//     default), moves the fence to a new, recorded era and goes on. A restarted static member
//     that finds its own token is handed over the same way, logged at INFO.
//     A refusal whose error has a Moved method reporting true (fence/shard's ErrMoved: the
//     partition's fence was retired because the partition is moving to another database) is
//     neither: the worker waits with backoff and claims the partition afresh, which reaches
//     the new database once the move is published (WARN while it waits).
//  4. Poison records: a handler error marked [Permanent] (named with [Batch.Fail], which
//     returns a *partition.RecordError, or found by applying one record at a time), or an
//     error of a statement in pgfence's (or pgbulk's) transaction that the database refused for
//     its data, rolls the batch back. The latter is read from the SQLSTATE, the same way
//     however the statement was sent (queued Exec, Exec without arguments, Query, QueryRow,
//     SendBatch) or at the commit (a deferred constraint): class 22 (data exception) and class
//     23 (integrity constraint violation) are permanent, but 23503 (foreign key), 23505
//     (unique) and 23P01 (exclusion), which a concurrent writer can cause, are retried; the
//     fence's own errors and errors that are not the database's never are. The batch is rolled
//     back; the records before it are applied, the poison record is dead-lettered in a
//     fenced transaction that advances the fence over it, and processing goes on after it. The
//     copy goes to [DeadLetterTopic] (default "<topic>.dlq", which must exist, with the headers
//     baton.dlq.*). With [FencedDeadLetters] (outboxconsumer.DeadLetters)
//     it is an outbox row written in that transaction: a zombie never dead-letters. Otherwise
//     it is produced from inside the transaction, after the fence check: at least once, and not
//     fenced against a paused member; readers deduplicate direct copies on (baton.dlq.group,
//     baton.dlq.topic, baton.dlq.partition, baton.dlq.offset), and baton.dlq.token tells whose
//     each copy is. With [AdmitDeadLetters] (outboxconsumer.AdmitDeadLetters) the record is
//     first admitted in that transaction where the receiver deduplicates: a copy of a record
//     already applied or dead-lettered is dropped, and a dead-lettered one's later copies are.
//  5. Rebalance barrier: OnPartitionsRevoked cancels the partition's context, waits until its
//     in-flight batch committed or rolled back, commits the marked offsets, and only then
//     returns. OnPartitionsLost does the same without the commit. franz-go keeps heartbeating
//     while a handler runs and can revoke meanwhile: the callback waits for the handler.
//  6. Backpressure: at most [MaxInflightPerPartition] records per partition (then its fetching
//     is paused until half are done) and [MaxInflight] overall (then polling stops; one poll
//     can overshoot it by what the client had buffered). A pause is cleared when its partition
//     is revoked or lost, so a later assignment fetches again.
//  7. After each committed batch, and every idle interval, the partition's own goroutine runs
//     the [AfterCommit] function with the partition's fence key and token: the
//     outbox relay runs there (consumer.AfterCommit(relay.AfterCommit(), time.Second)), so
//     relaying a partition's side effects lives exactly where its ownership does.
//
// A consumed topic that does not exist is logged at ERROR, at once and then every minute while
// it stays missing (the member goes on with the others). A partition of a topic that was
// recreated or grew is held (claimed, nothing applied, ERROR,
// baton.consumer.topic_refusals) until an operator runs baton topics reset or ack; records
// deleted from the log before they were applied are reported (ERROR,
// baton.consumer.records.lost) and processing goes on.
//
// # Parallelism inside a partition
//
// A partition's batch is applied in one transaction, whose statements cannot run in parallel;
// the slow part of handling a record is usually a call to another service. The [Lanes]
// option puts that part in a prepare function, which the consumer runs per record outside
// the transaction, in up to [Lanes] lanes per partition: one key's records on one lane in
// offset order, never two at once; different keys in parallel. The partition's goroutine stays
// its only writer, applying the contiguous prefix of prepared records in fenced transactions
// with each record's result in [Batch.Prepared]. Preparing is not fenced: a record
// prepared and not applied when the partition moves is prepared again by the next owner, and a
// zombie's lanes can keep calling until it notices, so preparing must be repeatable (a read, or a
// call with an idempotency key) and must not depend on what the handler writes; an effect that
// must happen once is appended to the outbox by the handler.
//
// # Guarantees
//
// With a sink that honours the fence.Sink contract: every record of an owned partition is
// applied to the sink exactly once, in offset order (a crash between the sink commit and the
// Kafka commit loses and duplicates nothing); no write under a lower token commits after a
// higher one was accepted, so a paused or partitioned member (a zombie) cannot overwrite its
// successor's work, whatever franz-go believes; a regression is never silently accepted (the
// member must prove it is current and the recovery is recorded) and never silently stalled
// (ERROR log and metric, and recovery by default). Side effects outside the sink's transaction
// (HTTP calls, emails) are not covered: use the outbox. DESIGN.md, "What Baton does not
// cover", lists every limit.
//
// # Group protocol, watchdog and handovers
//
// The classic group protocol is the default; Kafka 4.x's consumer protocol is opt-in with
// [GroupProtocol]("consumer"), proven on Kafka 4.3+. Run starts the Kafka
// client from Baton's own defaults, which [Kafka] options override: the client id
// "baton-<host>-<pid>" (franz-go's "kgo" is every member's, so owners could not be told apart
// in the group's description or in baton status; a kgo.ClientID is kept), the
// cooperative-sticky balancer and a 500ms heartbeat interval (franz-go's 3s), because the
// other members learn that one left or expired only from their next heartbeat; the session
// timeout stays franz-go's 45s. Fetches take at most 64 KiB of a partition (franz-go's 1 MiB
// of small records is tens of thousands of records, far past [MaxInflightPerPartition], all
// held in memory) and wait at most 100ms for data (franz-go's 5s: a partition resumed after
// backpressure joins only the next fetch, and waited that long behind a fetch of caught-up
// partitions). A graceful handover (Run's ctx cancelled) takes about half a second, a crash
// takeover the session timeout plus about a heartbeat interval. A static member
// (kgo.InstanceID) restarted within the session timeout gets its partitions back without a
// rebalance; each moves to a new era (which fences the old process), logged at INFO and
// counted in baton.consumer.handovers, with RecoverRegressions(false) too.
//
// In a classic group, a watchdog stops every partition at once (baton.consumer.watchdog.stops,
// one ERROR) when no session-refreshing request has been answered for longer than the session
// timeout, instead of letting a member cut off from the coordinator go on applying what it
// fetched and calling remote services; a partition still assigned after the coordinator
// answers again is restarted and claims afresh. It judges by this process's clock and saves
// only wasted work: the fence is what stops a zombie's writes.
//
// # Observability
//
// Metrics (OpenTelemetry API, [Telemetry]): baton.consumer.records.applied,
// .records.duplicates_skipped, .stale_refusals, .claims, .claims.stale, .regressions,
// .recoveries, .handovers (same-generation handovers), .records.dead_lettered, .rebalances,
// .retries, .client_errors (by baton.error.kind: connect, group, fetch), .watchdog.stops
// (partitions stopped because the member's session expired), .topic_refusals (a partition held
// because its topic was recreated or grown, by baton.outcome), .records.lost (records deleted
// from the log before they were applied), .apply.duration (histogram) and .lag (gauge: the
// records of a partition the sink has not applied, its high watermark minus the sink's
// position + 1; the high watermark comes from fetches and, since fetching stops while a
// partition's sink is stalled, from end offsets listed every 5s; a partition whose claim has not
// told its position yet is estimated from the group's committed offset). Lag is reported only
// for the partitions this member owns now: a revoked or lost partition's series ends with it, so
// sum(baton_consumer_lag) counts each partition once. Every series is labelled by baton.group
// (the consumer group, as the outbox's are); a partition's counters, and its outcomes known in
// advance, start at 0 when it is assigned, and the client error kinds when Run starts, so that
// a rate or increase sees their first event. One span per batch ([Telemetry]) linked to the
// producers' spans found in the records' headers, with topic, partition, token and outcome. Logs go to [Logger]
// (default slog.Default(), so refusals are never silent).
package consumer
