package consumer

// mutant names a deliberately broken variant of the consumer, for the mutation tests only:
// the package's tests set it (from BATON_CONSUMER_MUTANT) in a child process and require the
// tests that guard each mutation point to fail. It is empty in every real build, where each
// mutation point costs one comparison with an empty string.
var mutant string

// The named mutants. Each is a bug that once went unnoticed or would land silently.
const (
	mutantCurrentGenToken     = "CurrentGenerationToken"          // token from the group's generation at write time, not at assignment
	mutantStaleIsRegression   = "StaleClaimIsRegression"          // a stale claim recovered without asking the coordinator
	mutantDeadLetterFirst     = "DeadLetterBeforeFence"           // the dead-letter record produced before the fence check
	mutantNoFilter            = "AppliedRecordsNotFiltered"       // records at or below the sink's position applied anyway
	mutantRevokeNoWait        = "RevokeDoesNotWait"               // a revoke returns before the in-flight batch finished
	mutantStaleClaimUncounted = "StaleClaimNotCounted"            // the stale-claim refusal not counted in its metric
	mutantBlindHeartbeat      = "BlindHeartbeatProof"             // currentness proven with a Heartbeat, which a loading coordinator answers blindly
	mutantEqualTokenAccepted  = "EqualTokenOtherClaimantAccepted" // an equal token held by another claimant taken over
	mutantRecoverSameExpected = "RecoverConflictRetriedSame"      // a lost Recover retried with the same expected token
	mutantRelayNoReclaim      = "RelayStaleNotReclaimed"          // a relay Flush refused as stale only logged: an idle owner never re-claims
	mutantHandlerVerdict      = "HandlerErrorReadAsVerdict"       // a handler error wrapping a fence sentinel read as the sink's verdict
	mutantWatchdogOff         = "WatchdogOff"                     // a member whose session expired keeps working its partitions
	mutantTopicUnchecked      = "TopicIdentityUnchecked"          // a claim proceeds without comparing the topic with the identity stored with the fences (finding 5)
	mutantGrowthUnheld        = "GrownPartitionNotHeld"           // a partition added by growing the topic is applied before the growth is acknowledged (finding 7)
	mutantTopicNotConfirmed   = "TopicResetNotConfirmed"          // no Load after the topic comparison: a reset between the claim and it goes unnoticed
	mutantBatchTopicUnchecked = "BatchTopicIDUnchecked"           // a fetched batch's topic ID not compared with the claim's
	mutantLossUnreported      = "DataLossUnreported"              // records deleted before they were applied skipped silently
)

// The lanes' named mutants (lanes.go).
const (
	mutantLanesPastGap = "LanesAdvancePastGap" // the writer applies prepared records past one still in a lane
)

func is(m string) bool { return mutant != "" && mutant == m }

// Appended by the dead-letter work (issue 10, finding 8).
const (
	mutantDeadLetterDirect = "DeadLetterProducedDirectly" // FencedDeadLetters bypassed: the copy produced to Kafka inside the transaction
)

// Appended by the review of the dead-letter work (rev-dlq).
const (
	mutantDeadLetterVerdict = "DeadLetterErrorReadAsVerdict" // a FencedDeadLetters error wrapping a fence sentinel taken for the sink's verdict
)

// Appended by the relay shard-count work (issue 10, finding 7, standalone relay).
const (
	mutantIdleTopicUnchecked = "IdleTopicChangeUnchecked" // an idle partition runs its after-commit hook past a growth watchTopics saw (a standalone relay's shards relay on)
)

// Appended by the static-member handover work (issue 14).
const (
	mutantHandoverUnproven     = "HandoverUnproven"     // an equal token held by this member's identity recovered without the coordinator's proof
	mutantHandoverIsRegression = "HandoverIsRegression" // an equal token held by this member's own previous worker treated as a regression (ERROR, stopped with RecoverRegressions(false))
	mutantEraMovedIsRegression = "EraMovedIsRegression" // a stored token higher only by its era (its epoch below ours) treated as a regression
)

// Appended by the review of topic growth (rev-topics).
const (
	mutantLanesDeadLetterUnheld = "LanesDeadLetterPastHold" // a poison record the lanes hand deadLetter is dead-lettered without comparing a topic that changed
)

// Appended by the fix of the chaos topic-grow stall (session 6).
const (
	mutantRefusedNotRetried    = "RefusedPartitionNotRetried" // a partition the coordinator refused stays unprocessed while a later session keeps it assigned
	mutantRefusedSessionMissed = "RefusedDuringSessionMissed" // a refusal decided after a new session's OnPartitionsAssigned waits for yet another session
	mutantRevivedTakesStale    = "RevivedTakesStaleFetch"     // a restarted worker is handed records fetched before its restart, ahead of its claim's seek
)
