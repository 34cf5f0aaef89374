// Package fence is Baton's fencing contract: the rules a sink applies, atomically and next to
// the data, so that a writer that lost ownership of a partition without knowing it (a GC pause,
// a frozen VM, SIGSTOP, a slow network) cannot write after its successor has.
//
// Checking "am I still the owner?" before writing cannot do this: the pause can fall between
// the check and the write. Only the resource can refuse the write, so every write carries a
// [Token] and the sink keeps, per [Key] (consumer group, topic, partition), the highest token
// it has accepted and the last position (Kafka offset) it applied, in the same transaction as
// the data.
//
// # Tokens and eras
//
// A token is (Era, Epoch), compared lexicographically. Epoch is the consumer-group generation
// at which the owner was assigned the partition: successive owners of a partition get strictly
// higher generations. Generations can go backwards, though (a group deleted or expired and
// recreated starts again at 1), and a fence that only remembers "the highest" would then refuse
// the new, legitimate owner forever. Era is the guard for that: it is stored with the fence and
// raised only by [Sink.Recover], so every token of a later era outranks every token of an
// earlier one, and no writer can raise it by presenting a bigger number.
//
// # Invariants every Sink keeps
//
//   - One highest token per key. A claim or write under a lower token fails with a
//     [*StaleError] (errors.Is [ErrStale]) and changes nothing; it is never transient. A token
//     of a later era than the stored one is refused with [ErrInvalid]: eras advance only
//     through Recover.
//   - Claim: a new owner raises the fence to its token and learns the position to resume
//     after (the sink's position is authoritative, not Kafka's committed offset). The sink
//     stores who holds the token (State.Claimant) and decides in the claiming statement
//     itself whether an equal token may be taken: only by the claimant that already holds
//     it (an idempotent re-claim) or, for the zero token of a fence never claimed, by
//     anyone. Another claimant presenting the stored token is refused as stale. So at most
//     one claimant ever holds a given token, and no caller has to compare tokens itself
//     (a read, a comparison and a separate claim race with every other claimer).
//   - Apply / Advance: the fence check-and-advance and the caller's writes commit together or
//     not at all. The token must equal the stored one: a lower one is stale, a higher one
//     [ErrNotClaimed] (writes happen only under a claimed token; since one claimant holds a
//     token, the token names the writer and the write needs no claimant). One owner writes
//     many batches under its token. A batch is the positions first..last: last at or below
//     the stored position fails with [ErrDuplicate] and the caller skips it; first at or
//     below it fails with [ErrOverlap] (part of the batch was applied: the caller reloads and
//     applies only the rest); positions may have gaps, so the rule is "first above the
//     stored position", not "right after it". A crash between the database commit and the
//     Kafka offset commit therefore loses nothing and applies nothing twice. Stale wins over
//     duplicate and overlap: a zombie is told to stop, not to skip and carry on.
//   - Serialized per key: a transaction that advanced a key holds it until it ends, so a lower
//     token can never commit after a higher one was accepted.
//   - Regression is refused, never silently accepted: a current owner that presents a lower
//     token than the stored one (the group was recreated) is indistinguishable from a zombie
//     at the sink and is refused as stale. The caller, after proving with the group
//     coordinator that the member is the current owner, reports a [*RegressionError] and may
//     call [Sink.Recover]: a compare-and-set from the exact stored token to
//     (stored era + 1, the owner's epoch), held by the caller's claimant and recorded as a
//     [Recovery] with a reason. Losing the compare-and-set gives [ErrConflict]: the stored
//     token moved (or the caller's own recovery committed and its reply was lost), so the
//     caller reloads and decides again; retrying the same compare-and-set cannot succeed.
//     The position is kept.
//
// # Topic identities
//
// A fence's position is an offset of one incarnation of its topic, and a key's partition
// depends on the topic's partition count. A [Topics] sink (pgfence, sqlitefence and redisfence
// are) stores, per (group, topic), the Kafka topic ID (KIP-516) and the acknowledged partition
// count, appended as [TopicRecord]s: the first claim that sees a topic adopts it (fences from
// before the upgrade adopt the incarnation present then), and only [Topics.ResetTopic], an
// operator's recorded compare-and-set, changes it. The consumer compares it after every claim:
// a topic with another ID ([ErrTopicRecreated]) or more partitions
// ([ErrTopicGrown]) is held, as a [*TopicError], until the reset. Resetting a recreated topic
// moves every fence of the topic, in the same transaction, to a new era with no claimant and
// no position, each recorded as a [Recovery]: the new incarnation is read from its beginning,
// and no token of the old one is accepted again. A sealed fence (epoch math.MaxInt64, which
// no claim in its era reaches) stays sealed in the new era, with its claimant.
//
// # Keyed fences
//
// A [KeyedSink] fences per entity instead of per partition: for each (scope, id) it keeps the
// highest (token, sequence) admitted. A receiver (an inbox) admits a message inside the
// transaction that applies its effect: [Admitted] means apply it, [Duplicate] (same token,
// sequence not higher) and [Stale] (lower token) mean drop it. A higher token admits any
// sequence, since a new owner numbers its messages afresh.
//
// The rules themselves are written once, in this module's internal/fencecheck, and every store
// here applies them; fence/fencetest is the conformance suite each store runs, and an author
// of another store runs it too. Users of a store need neither. Stores: fence/pgfence
// (PostgreSQL), fence/sqlitefence (SQLite; a file in a test's temporary directory serves
// tests), fence/redisfence (Redis). This package imports only the standard library.
package fence
