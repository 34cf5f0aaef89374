// Package mutant names the deliberately broken variants of the outbox runtime (the relay, the
// inbox, outboxstore's validation and outboxconsumer's dead-letter wrapper), for the mutation
// tests only: a package's tests call [Set] with $BATON_OUTBOX_MUTANT in a child process
// (outbox/internal/mutanttest) and require the tests that guard each mutation point to fail.
// Nothing but a test calls Set, so in every real build each mutation point costs one
// comparison with an empty string.
package mutant

// Env is the environment variable the tests read the mutant to build from.
const Env = "BATON_OUTBOX_MUTANT"

// The named mutants. Each is a bug that would land silently without the test that kills it.
const (
	RelayUnfenced        = "RelayPublishesUnderStaleToken"  // a relay refused as stale reads its rows unfenced and publishes them
	RelayMarksBeforeAck  = "RelayMarksBeforeAck"            // rows marked delivered before the broker acknowledged them
	InboxAdmitsDuplicate = "InboxAdmitsAtOrBelowStored"     // a sequence at or below the admitted one admitted again
	InboxScopeNoDest     = "InboxScopeIgnoresDestination"   // admissions scoped without the destination topic and partition (finding 6)
	DeadRowSkipped       = "DeadLetteredRowSkippedNoRecord" // an undeliverable row marked delivered, its record and reason lost
	GiveUpUnbounded      = "RelayGiveUpBoundIgnored"        // an undeliverable row given up at its first failure, GiveUpAfter ignored (finding 9)
	FlushUnbounded       = "RelayFlushTimeoutIgnored"       // a flush holds up the partition past FlushTimeout (finding 9)
	StaleHidden          = "AfterCommitHidesStaleRefusal"   // AfterCommit swallows a stale refusal: the consumer never re-claims
	AppendUnvalidated    = "AppendMessagesNotValidated"     // outboxstore.ValidateAppend passes every message
	DeadLetterDirect     = "DeadLettersBypassTheOutbox"     // outboxconsumer.DeadLetters leaves the copy to the consumer's direct produce
)

// Appended by the lanes review (rev-lanes).
const (
	InboxPreparedUnfiltered = "InboxPreparedNotFilteredWithRecords" // outboxconsumer.Handler drops records the inbox refuses but not their Batch.Prepared
)

var active string

// Set builds the mutant named m (empty: none). Tests only.
func Set(m string) { active = m }

// Is reports whether the mutant m is built.
func Is(m string) bool { return active != "" && active == m }

// Appended by the relay shard-count work (issue 10, finding 7, standalone relay).
const (
	ShardCountUnchecked = "PrepareShardsCountUnchecked" // outboxconsumer.PrepareShards accepts a shard count other than the acknowledged one: entities move between shards unheld
)
