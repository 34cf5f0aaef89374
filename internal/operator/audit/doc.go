// Package audit is Baton's online auditor: it judges, while a group runs, the invariants the
// chaos checker judges after a run, from what Baton already records next to the data (the
// fences, their recorded recoveries, the outbox rows and cursors, the inbox admissions) and
// from Kafka (the group's committed offsets, each partition's log start and end, and the
// outbox's output topics). cmd/baton's 'audit' command is a thin layer of flags over it.
//
// Each [Check], per group and partition:
//   - [Skipped]: the sink's position lies within the log: a log start past position+1 is data
//     loss (records deleted by retention or DeleteRecords before they were applied, counted);
//     Kafka's committed offset is never ahead of position+1; a position is never at or past the
//     high watermark. Positions are judged only against the incarnation of the topic they belong
//     to: while the brokers' topic ID is not the one stored with the fences (a topic recreated
//     under the same name, not yet reset), the topic's fences are not judged against the log
//     (nor by Liveness) and [Report] Recreated names it.
//   - [Tokens]: a stored token never decreases between observations, is never below a
//     recorded recovery's, and every era above 0 has its recorded recovery (recoveries and
//     topic resets are the only ways up an era).
//   - [Outbox]: the rows above the cursor are gap-free up to the last allocated sequence; the
//     cursor has not passed a row with no copy on the output topics (unless dead-lettered);
//     the oldest pending row is younger than [Config] OutboxAge.
//   - [Delivery]: on the output topics, per source, no copy carries a sequence the outbox
//     never allocated, and a first copy's token is no lower than an earlier sequence's;
//     re-published copies are counted ([Report] Republished), never flagged.
//   - [Inbox]: an entity's admitted (token, sequence) never decreases.
//   - [Liveness]: a partition with a lag whose sink position stood still longer than Stall.
//   - [Ownership]: in a stable group, a fence's claimant is the member the group assigned the
//     partition to (consumers claim on assignment, their claimants name their member), or
//     becomes it within Handover: a claimant of another member, or of one gone from the group,
//     holding the fence longer is a member holding a partition it no longer owns. And Kafka's
//     committed offset never moves on a partition no fence claims: a member commits there
//     without the fence (an unfenced writer, which none of the other checks can see).
//
// Why reading is free of races with the members: Kafka's committed offsets and log starts are
// read before the sink's positions, and the output topics' end offsets after the outbox cursors;
// every one of these only rises (within an era), so what the order shows is real. The brokers'
// topic IDs are read after their offsets and the stored ones before the fences, so fences still
// holding an older incarnation than the offsets' always show two IDs. A partition's end is
// asked of its leader at the highest leader epoch any broker reports, with that epoch, so a
// broker cut off from the others that still believes it leads answers for no partition. Judgements
// that compare two observations (Tokens' decrease, Inbox, Liveness, Ownership, the position past
// the log end, a copy's sequence against the cursor read after it) need a second pass: 'baton audit
// -once' judges only what one look can show.
//
// A sharded sink (fence/shard; [Config] Shards) is audited shard by shard: each shard's fences,
// outbox cursors and inbox admissions are read and judged, a partition's only on the shard the
// placement (read from the home shard) puts it on, so no partition is judged twice; a fence
// fence/shard retired when its key moved is never judged (its reserved claimant is no member
// and its position stands where the key left), and the Ownership check's "no fence claims"
// looks at the fences of every shard. [Report] Shards gives each shard's count, and a shard
// that cannot be read is named while the others are judged.
//
// Each violation is counted once (baton.audit.violations, attributes check, group, topic,
// partition), logged at ERROR with its evidence, and listed by [Auditor.Handler]. The auditor
// never writes: the store is opened read-only ([status.ReadOnly]). Its own load is bounded and
// counted per pass: a fixed number of statements (plus one per source topic, its stored identity, and one bounded
// read per outbox gap found),
// [Config] InboxRows admissions (a page of the keyed table; the pages go round), at most
// MaxBytes read from the output topics, which are read incrementally from their start. Its
// memory grows with the inbox entities and the sources observed.
//
// What it cannot see: a write the fence refused leaves no record (the members count
// baton.consumer.stale_refusals); a lost or doubled update inside the application's own tables
// is the application's invariant; copies whose sequences were delivered before the audit began
// are not judged (the output topics may no longer hold them); OutputTopics must list every
// destination of the group's outbox, or the rows sent elsewhere look undelivered. Output topics
// also written by transactional producers end on commit markers the reader never sees, so it
// never counts itself caught up and the cursor-past-delivery judgement waits. The fences of a
// topic the group no longer reads look stalled while records keep arriving there (restrict the
// audit with Config.Topics). The owners are read with the classic protocol's DescribeGroups,
// which shows no assignment of a KIP-848 group: its claims are not compared with its owners (its
// commits still are with its fences). The inbox judged is the store's whole keyed table,
// whichever receivers wrote it.
//
// Its reads are not one snapshot: each check reads what can move in the order that keeps a
// correct member's concurrent write from looking like a violation (the recoveries before the
// fences, Kafka's offsets before the sink's positions, the stored topic IDs before the fences and
// the brokers' after the offsets, the outbox cursor before the dead letters
// before the output topics' ends). Where that is not enough it raises false alarms, known and
// not yet filtered: a topic recreated where no topic ID tells the incarnations apart (brokers
// without topic IDs, or fences that never stored one) shows its fences' positions past the new
// log's end; a Kafka outage on the auditor's side longer than Stall
// followed by new records reads as a stall; an old incarnation's committed offsets left in
// Kafka after a reset whose first commit failed read as a committed offset ahead; a store URL
// pointing at a lagging hot standby makes positions, fences and admissions look behind Kafka
// (audit the primary); dead letters deleted by hand, or output topics' retention passing the
// reader, before a pass has read their copies look like delivery holes.
package audit
