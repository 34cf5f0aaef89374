// Package mutants holds Baton's mutants: each a patch (consumer/, outbox/, ... below this
// directory, one per mutant, named after it) that reintroduces one bug into a scratch copy of
// the module, with the tests that must catch it. Nothing in the production source knows about
// them. The runner (internal/testkit/cmd/mutants, 'make mutants') applies each patch to a copy
// and requires its guards to fail; the chaos tests build cmd/baton from a patched copy
// (BuildBaton) to run a mutant inside real worker processes.
//
// A change to a patched file may move a patch's context so that it no longer applies
// (TestEveryMutantHasItsPatchAndApplies and the runner report it). To refresh one, in a clean
// checkout:
//
//	patch -p1 --merge < internal/testkit/mutants/consumer/Name.patch  # fix what conflicts
//	git diff -- consumer > internal/testkit/mutants/consumer/Name.patch.new
//	git checkout -- consumer && mv internal/testkit/mutants/consumer/Name.patch{.new,}
//
// then run it: go run ./internal/testkit/cmd/mutants -run '^Name$'. A new mutant is a patch
// made the same way (edit, git diff, restore) and its entry in All. A patch edits production
// files only (a test that shares the broken rule, like the model's copy of the protocol, would
// fail whatever production does), and its guards must fail by asserting the bug's cause:
// Want names it, and a guard that fails only by timing out a wait kills a Liveness mutant
// only.
//
// Test plumbing only: no library or command package imports it.
package mutants

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

//go:embed cmd consumer fence internal outbox
var patches embed.FS

// A Mutant is one patch and the tests that must catch it.
type Mutant struct {
	Name    string   // the patch is <Package>/<Name>.patch in this directory
	Package string   // the package directory whose tests are the guards
	Guards  []string // the tests that must fail: top-level names, or Test/sub for a subtest
	Want    string   // a regular expression each failing guard's own output must match: the cause it asserts ("" for any)
	Bug     string   // the bug the patch reintroduces
	Safety  bool     // on a claim, proof, fence, outbox or inbox path: a zombie could write, or a record be lost
	// Liveness: the bug is a stall (work that never resumes), so a guard that fails only by
	// timing out its wait for that work ("timed out waiting ...") kills the mutant. For any
	// other mutant such a failure is no kill: a slow run would look the same.
	Liveness bool
	Group    string // GroupSafety: 'make mutants-safety' (in 'make test', so CI) and 'make mutants'; GroupFull: 'make mutants' only
}

// The groups a mutant runs in.
const (
	GroupSafety = "safety"
	GroupFull   = "full"
)

// audit is the auditor's package; its guards run on SQLite and kfake.
const audit = "internal/operator/audit"

// model is the model check's narrow exploration of the protocol under one fault set.
func model(target string) string { return "TestModelTargetedFaults/" + target }

// All lists every mutant.
var All = []Mutant{
	// The consumer: claim, proof, apply, dead-letter, runtime.
	{Name: "CurrentGenerationToken", Package: "consumer", Guards: []string{"TestTokenIsTheAssignmentGeneration"}, Want: `partitions kept A's assignment token`,
		Bug: "the token taken from the group's generation at write time, not at assignment", Safety: true},
	{Name: "StaleClaimIsRegression", Package: "consumer", Guards: []string{"TestStaleClaimOfZombieNeverRecovers", model("stale-claim")}, Want: `not current raised the era|never proved its ownership`,
		Bug: "a stale claim recovered without asking the coordinator", Safety: true},
	{Name: "DeadLetterBeforeFence", Package: "consumer", Guards: []string{"TestDeposedOwnerDoesNotDeadLetter"}, Want: `dead-letter topic holds \d+ records, want 1`,
		Bug: "the dead-letter record produced before the fence check", Safety: true},
	{Name: "DirectDeadLetterUnflushed", Package: "consumer", Guards: []string{"TestDirectDeadLetterOverPgbulkChecksTheFenceFirst"}, Want: `which the fence already refused: a zombie dead-lettered`,
		Bug: "the direct dead letter produced from a dead-letter transaction that has not sent its fence statement yet (pgbulk's Sink): a zombie dead-letters", Safety: true},
	{Name: "DeadLetterProducedDirectly", Package: "consumer", Guards: []string{"TestZombieNeverDeadLettersThroughTheTransaction"}, Want: `bypassing the transaction`,
		Bug: "a DeadLetterer handler bypassed: the copy produced to Kafka inside the transaction", Safety: true},
	{Name: "DeadLetterErrorReadAsVerdict", Package: "consumer", Guards: []string{"TestDeadLetterErrorWrappingAFenceSentinelIsNotAVerdict"}, Want: `skipped with no dead letter`,
		Bug: "a DeadLetterer's error wrapping a fence sentinel taken for the sink's verdict", Safety: true},
	{Name: "AppliedRecordsNotFiltered", Package: "consumer", Guards: []string{"TestOverlapAppliesOnlyTheRest"}, Want: `refused \d+ batches as overlapping its position`,
		Bug: "records at or below the sink's position applied anyway", Safety: true},
	{Name: "RevokeDoesNotWait", Package: "consumer", Guards: []string{"TestRevokeWaitsForTheInflightBatch"}, Want: `the revoke returned early`,
		Bug: "a revoke returns before the in-flight batch finished", Safety: true},
	{Name: "OutageLeavesGroup", Package: "consumer", Guards: []string{"TestTransientSinkOutageKeepsMember"}, Want: `during a transient outage`,
		Bug: "a claim failing on a database outage (an error without a SQLSTATE) taken for an unusable sink: the member leaves the group"},
	{Name: "UnusableSinkKept", Package: "consumer", Guards: []string{"TestUnusableSinkGivesPartitionsBack/28P01"}, Want: `timed out waiting for the healthy member applies every partition`,
		Bug: "a member that cannot use its sink (wrong password, missing table or grant) keeps its partitions unclaimed", Liveness: true},
	{Name: "StaticMemberKept", Package: "consumer", Guards: []string{"TestUnusableSinkStaticMemberLeaves/classic"}, Want: `timed out waiting for the healthy member applies every partition within half`,
		Bug: "a static member that cannot use its sink is not removed from the group: its partitions wait for its session timeout, and come back to it when it restarts within that", Liveness: true},
	{Name: "StaleClaimNotCounted", Package: "consumer", Guards: []string{"TestRegressionRecovered"}, Want: `stale claims counted 0`,
		Bug: "the stale-claim refusal not counted in its metric"},
	{Name: "BlindHeartbeatProof", Package: "consumer", Guards: []string{"TestStaleClaimOfZombieNeverRecovers"}, Want: "not current raised the era",
		Bug: "currentness proven with a Heartbeat, which a loading coordinator answers blindly", Safety: true},
	{Name: "EqualTokenOtherClaimantAccepted", Package: "consumer", Guards: []string{"TestRegressionAtEqualGeneration"}, Want: `recoveries \[\], want one`,
		Bug: "an equal token held by another claimant taken over", Safety: true},
	{Name: "RecoverConflictRetriedSame", Package: "consumer", Guards: []string{"TestRecoverConflictReloads", model("recover-conflict")}, Want: `timed out waiting for records applied after the recovery|liveness`,
		Bug: "a lost Recover retried with the same expected token", Liveness: true},
	{Name: "RelayStaleNotReclaimed", Package: "consumer", Guards: []string{"TestIdleOwnerReclaimsWhenItsRelayIsRefused"}, Want: `timed out waiting for the idle owner re-claims`,
		Bug: "a relay Flush refused as stale only logged: an idle owner never re-claims", Liveness: true},
	{Name: "HandlerErrorReadAsVerdict", Package: "consumer", Guards: []string{"TestHandlerErrorWrappingAFenceSentinelIsRetried"}, Want: `the handler's error was read as the sink's verdict`,
		Bug: "a handler error wrapping a fence sentinel read as the sink's verdict", Safety: true},
	{Name: "WatchdogOff", Package: "consumer", Guards: []string{"TestWatchdogStopsAnExpiredMember"}, Want: `the watchdog never fired`,
		Bug: "a member whose session expired keeps working its partitions"},
	{Name: "TopicIdentityUnchecked", Package: "consumer", Guards: []string{"TestRecreatedTopicHeldUntilReset", model("topic-recreated")}, Want: `skipped as applied|skipped: the fence's position counts`,
		Bug: "a claim proceeds without comparing the topic with the identity stored with the fences", Safety: true},
	{Name: "TopicResetNotConfirmed", Package: "consumer", Guards: []string{"TestTopicResetBetweenClaimAndCompare", model("topic-recreated")}, Want: `skipped as applied|skipped: the fence's position counts|liveness`,
		Bug: "no Load after the topic comparison: a reset between the claim and it goes unnoticed", Safety: true},
	{Name: "BatchTopicIDUnchecked", Package: "consumer", Guards: []string{"TestBatchOfAnotherTopicIDNotApplied"}, Want: `applied under a claim that compared`,
		Bug: "a fetched batch's topic ID not compared with the claim's", Safety: true},
	{Name: "GrownPartitionNotHeld", Package: "consumer", Guards: []string{"TestGrownTopicHeldUntilAcknowledged", model("growth")}, Want: `before the growth was acknowledged|before the operator acknowledged the growth`,
		Bug: "a partition added by growing the topic applied before the growth is acknowledged", Safety: true},
	{Name: "DataLossUnreported", Package: "consumer", Guards: []string{"TestDeletedRecordsReportedAsLoss"}, Want: `records lost counted 0`,
		Bug: "records deleted before they were applied skipped silently"},
	{Name: "LossUncheckedWithoutPosition", Package: "consumer", Guards: []string{"TestDeletedRecordsReportedAsLossInAMovedEra"}, Want: `records lost counted 0, want 6`,
		Bug: "records deleted below the offset a claim with no position sought to skipped silently"},
	{Name: "IdleTopicChangeUnchecked", Package: "consumer", Guards: []string{"TestIdleGrownTopicHoldsAfterCommit"}, Want: `timed out waiting for partitions 0 and 1 held`,
		Bug: "an idle partition runs its after-commit hook past a topic growth (a standalone relay's shards relay on)", Safety: true, Liveness: true},
	{Name: "HandoverUnproven", Package: "consumer", Guards: []string{"TestZombieOfTheSameIdentityNeverRecovers", model("handover-proof")}, Want: `does not vouch for|never proved its ownership`,
		Bug: "an equal token held by this member's identity recovered without the coordinator's proof", Safety: true},
	{Name: "HandoverIsRegression", Package: "consumer", Guards: []string{"TestStaticMemberReplacedIsAHandover", "TestAssignmentEpochsRejoinInPlace", model("handover")}, Want: `regressions and the round's records not applied|needed a recovery|liveness`,
		Bug: "an equal token held by this member's previous worker treated as a regression", Liveness: true},
	{Name: "EraMovedIsRegression", Package: "consumer", Guards: []string{"TestModelStaticHandover", model("era-moved")}, Want: "liveness",
		Bug: "a stored token higher only by its era (its epoch below ours) treated as a regression", Liveness: true},
	{Name: "LanesAdvancePastGap", Package: "consumer", Guards: []string{"TestLanesNeverAdvancePastARecordInALane"}, Want: `while offset \d+ is still in its lane`,
		Bug: "the lanes' writer applies prepared records past one still in a lane", Safety: true},
	{Name: "LanesDeadLetterPastHold", Package: "consumer", Guards: []string{"TestLanesPoisonHeldAfterGrowth"}, Want: `dead-lettered while the topic was held`,
		Bug: "a poison record the lanes hand to dead-lettering dead-lettered without comparing a topic that changed", Safety: true},
	{Name: "RefusedPartitionNotRetried", Package: "consumer", Guards: []string{"TestRefusedPartitionRetriedInANewSession"}, Want: `timed out waiting for A applies everything`,
		Bug: "a partition the coordinator refused stays unprocessed while a later session keeps it assigned", Liveness: true},
	{Name: "RefusedDuringSessionMissed", Package: "consumer", Guards: []string{"TestRefusedDuringANewSessionRetried"}, Want: `timed out waiting for A applies everything`,
		Bug: "a refusal decided after a new session's assignment waits for yet another session", Liveness: true},
	{Name: "ResetOffsetNotEarliestAccepted", Package: "consumer", Guards: []string{"TestNewRefusesAResetOffsetOtherThanEarliest"}, Want: `accepted, it would skip records still in the log`,
		Bug: "a kgo.ConsumeResetOffset other than the log start accepted: a resume point below the log start moves to the end", Safety: true},
	{Name: "RevivedTakesStaleFetch", Package: "consumer", Guards: []string{"TestRevivedWorkerDropsRecordsFetchedBeforeItsClaim"}, Want: `a restarted worker not yet claimed was handed`,
		Bug: "a restarted worker is handed records fetched before its restart, ahead of its claim's seek", Safety: true},
	{Name: "ClaimTokenFromStoredEpoch", Package: "consumer", Guards: []string{"TestDecideClaimsAtTheAssignmentEpoch", model("batch-topic")}, Want: `want the stored era at the assignment's epoch|exceeded its bound of \d+ (steps deep|states)`,
		Bug: "the claim token taken from the stored epoch + 1, not the assignment's epoch: any member climbs above the owner (and the model's states never repeat)", Safety: true},
	{Name: "RecoverConflictsUncounted", Package: "consumer", Guards: []string{"TestDecideGivesUpAfterRecoverConflicts"}, Want: `Recover conflicts in a row did not give the partition up`,
		Bug: "Recover conflicts never counted: a partition whose fence keeps moving churns for ever"},
	{Name: "ConfirmingLoadEpochOnly", Package: "consumer", Guards: []string{"TestDecideConfirmingLoadComparesTheWholeToken"}, Want: `the confirming Load found .* and the worker went on`,
		Bug: "the Load confirming a claim compares only the epoch: another era, held by another claimant, passes as ours", Safety: true},
	{Name: "LoadingCommitIsProof", Package: "consumer", Guards: []string{"TestClassicProofLoadingCommitCannotTell"}, Want: `COORDINATOR_LOAD_IN_PROGRESS was taken as proof`,
		Bug: "an OffsetCommit answered COORDINATOR_LOAD_IN_PROGRESS taken as proof that the generation is current", Safety: true},
	{Name: "RetainedProvenByCommitAlone", Package: "consumer", Guards: []string{"TestClassicProofRetainedNeedsTheDescription"}, Want: `proven kept .* by the OffsetCommit alone`,
		Bug: "a partition kept across a rebalance proven by the OffsetCommit at the current generation alone, without the description that assigns it", Safety: true},
	{Name: "MemberEpochBelowAssignmentUnchecked", Package: "consumer", Guards: []string{"TestAssignmentEpochsProofRefusesAMemberBelowTheAssignmentEpoch"}, Want: `the member epoch was not compared with the assignment's`,
		Bug: "the KIP-848 proof does not compare the member's epoch with the assignment's: a recreated group's member vouches for an older assignment", Safety: true},
	{Name: "MovedEraNoSeekToStart", Package: "consumer", Guards: []string{"TestMovedEraWithoutPositionReadsFromTheStart"}, Want: `resumed at Kafka's committed offset`,
		Bug: "a claim with no position in a fence Baton moved to a later era resumes at Kafka's committed offset, not the log's start: the records below it are skipped", Safety: true},
	{Name: "WatcherIgnoresTopicID", Package: "consumer", Guards: []string{"TestIdleRecreatedTopicHoldsAfterCommit"}, Want: `still ran .* after the topic was recreated with a new ID`,
		Bug: "the topic watcher compares only the partition count: an idle partition's after-commit hook (a standalone relay) runs on under a recreated topic's old incarnation", Safety: true},
	{Name: "RecordFilterOffByOne", Package: "consumer", Guards: []string{"TestOverlapAppliesOnlyTheRest"}, Want: `records after the sink's position were skipped`,
		Bug: "the position filter drops the record just after the sink's position as applied", Safety: true},
	{Name: "OverlapReadAsDuplicate", Package: "consumer", Guards: []string{"TestOverlapAppliesOnlyTheRest"}, Want: `records after the sink's position were skipped`,
		Bug: "a batch the sink refuses as overlapping its position skipped whole, as a duplicate: its records after the position never applied", Safety: true},
	{Name: "LanesFilterOffByOne", Package: "consumer", Guards: []string{"TestLanesNeverAdvancePastARecordInALane"}, Want: `sink position \d+, \d+ writes attempted, while offset 0`,
		Bug: "the lanes' intake drops the record just after the sink's position as applied: the writer advances past a record never applied", Safety: true},
	{Name: "DescribeReadsAnotherMember", Package: "consumer", Guards: []string{"TestClassicProofReadsItsOwnAssignment"}, Want: `proven owner of p0 .* by member-b's assignment`,
		Bug: "the classic proof's description read from the first member listed, not this one: another member's partition proves ownership", Safety: true},
	{Name: "StalePollAfterSeekTaken", Package: "consumer", Guards: []string{"TestFirstBatchAfterASeekWithAnUnexplainedGapIsDropped"}, Want: `would be skipped`,
		Bug: "a batch of a poll begun before a worker's seek, starting past it, handed to the worker after the seek", Safety: true},

	// The token sources.
	{Name: "GrantIDIsThePid", Package: "fence/lease/pglease", Guards: []string{"TestGrantIDUniqueForOnePid"}, Want: `two holders of one token would be the same claimant`,
		Bug: "a pglease grant's identity is its backend pid alone: after a restore two holders of a re-issued token are one claimant", Safety: true},

	// The outbox: relay, inbox, the stores' validation, the consumer adapters.
	{Name: "RelayPublishesUnderStaleToken", Package: "outbox", Guards: []string{"TestDeposedRelayPublishesNothing"}, Want: `the deposed relay published`,
		Bug: "a relay refused as stale reads its rows unfenced and publishes them", Safety: true},
	{Name: "RelayMarksBeforeAck", Package: "outbox", Guards: []string{"TestRelayMissingTopicIsBoundedThenDeadLettered", "TestRelayTopicAuthorizationIsGivenUpAfterGiveUpAfter"}, Want: `pending \[\].*want both rows`,
		Bug: "rows marked delivered before the broker acknowledged them", Safety: true},
	{Name: "InboxAdmitsAtOrBelowStored", Package: "outbox", Guards: []string{"TestInboxAdmitsEachRecordOnce"}, Want: `admitted, <nil>; want duplicate`,
		Bug: "a sequence at or below the admitted one admitted again", Safety: true},
	{Name: "InboxScopeIgnoresDestination", Package: "outbox", Guards: []string{"TestInboxAdmitsEachRecordOnce", "TestAdmissionScope"}, Want: `duplicate, <nil>; want admitted|admissionScope = .*, want`,
		Bug: "inbox admissions scoped without the destination topic and partition", Safety: true},
	{Name: "DeadLetteredRowSkippedNoRecord", Package: "outbox", Guards: []string{"TestRelayDeadLettersARowTheTopicRefusesAndGoesOn"}, Want: `dead letters = \[\], want`,
		Bug: "an undeliverable row marked delivered, its record and reason lost", Safety: true},
	{Name: "RelayGiveUpBoundIgnored", Package: "outbox", Guards: []string{"TestRelayMissingTopicIsBoundedThenDeadLettered", "TestRelayTopicAuthorizationIsGivenUpAfterGiveUpAfter"}, Want: `(dead-lettered|given up) after .*, want at least`,
		Bug: "an undeliverable row given up at its first failure, GiveUpAfter ignored"},
	{Name: "RelayFlushTimeoutIgnored", Package: "outbox", Guards: []string{"TestRelayMissingTopicIsBoundedThenDeadLettered"}, Want: `held up the partition for .*, FlushTimeout is`,
		Bug: "a flush holds up the partition past FlushTimeout", Liveness: true},
	{Name: "AfterCommitHidesStaleRefusal", Package: "outbox", Guards: []string{"TestDeposedRelayPublishesNothing"}, Want: `want a \*fence.StaleError`,
		Bug: "AfterCommit swallows a stale refusal: the consumer never re-claims", Safety: true},
	{Name: "AppendMessagesNotValidated", Package: "outbox/internal/outboxstore", Guards: []string{"TestValidateAppend"}, Want: `<nil>, want outbox:`,
		Bug: "outboxstore.ValidateAppend passes every message", Safety: true},
	{Name: "DeadLettersBypassTheOutbox", Package: "outbox/outboxconsumer", Guards: []string{"TestZombieDeadLetterThroughTheOutbox"}, Want: `dead letter of X .* reached the topic`,
		Bug: "outboxconsumer.DeadLetters leaves the copy to the consumer's direct produce", Safety: true},
	{Name: "DeadLetterAdmissionNotRecorded", Package: "outbox/outboxconsumer", Guards: []string{"TestCopyOfADeadLetteredMessageIsADuplicate"}, Want: `a copy of a dead-lettered message was admitted`,
		Bug: "a poison record dead-lettered without its inbox admission: a re-published copy is applied or dead-lettered again", Safety: true},
	{Name: "InboxPreparedNotFilteredWithRecords", Package: "outbox/outboxconsumer", Guards: []string{"TestInboxKeepsPreparedAligned"}, Want: `records and \d+ prepared results`,
		Bug: "outboxconsumer.Handler drops records the inbox refuses but not their Batch.Prepared", Safety: true},
	{Name: "InboxHandlerPassesStale", Package: "outbox/outboxconsumer", Guards: []string{"TestHandlerPassesOnlyAdmittedRecords"}, Want: `judged Stale by the inbox, reached the application`,
		Bug: "outboxconsumer.Handler drops only duplicates: a deposed producer's record the inbox judged Stale is applied", Safety: true},
	{Name: "PrepareShardsCountUnchecked", Package: "outbox/outboxconsumer", Guards: []string{"TestPrepareShardsChecksTheShardCount"}, Want: `want a \*fence.TopicError`,
		Bug: "outboxconsumer.PrepareShards accepts a shard count other than the acknowledged one: entities move between shards unheld", Safety: true},

	// The fast write paths' shared core.
	{Name: "KeyIntegerWidthsApart", Package: "internal/bulk", Guards: []string{"TestLayersKeysByCanonicalValue"}, Want: `held as different keys`,
		Bug: "bulk upserts group keys by Go value: int(7) and int64(7) reach one statement, which the database refuses (PostgreSQL: SQLSTATE 21000)"},

	// The Redis sink's commit script: its token check and its position check.
	{Name: "RedisCommitIgnoresEpoch", Package: "fence/redisfence", Guards: []string{"TestConformance/LowerTokenRefused"}, Want: `error = <nil>, want ErrStale`,
		Bug: "the Redis commit script compares the era but not the epoch: a zombie of the same era writes", Safety: true},
	{Name: "RedisCommitChecksLastNotFirst", Package: "fence/redisfence", Guards: []string{"TestConformance/OverlapRefused"}, Want: `error = <nil>, want fence: batch overlaps`,
		Bug: "the Redis commit script compares the batch's last position with the stored one, not its first: an overlapping batch is applied again", Safety: true},
	{Name: "RedisFenceWriteNotWaited", Package: "fence/redisfence", Guards: []string{"TestFailoverWithWaitKeepsTheClaim"}, Want: `the owner's claim was answered \(<nil>\) while the replica was stopped`,
		Bug: "the Redis store answers a fence write on a primary with replicas before they confirmed it (no WAIT): a failover loses the acknowledged claim and re-admits the zombie", Safety: true},
	{Name: "RedisFenceReplicaCountFixedAtCheck", Package: "fence/redisfence", Guards: []string{"TestWaitCountsAReplicaAttachedAfterTheCheck"}, Want: `the owner's claim while the replica attached after the check is stopped = <nil>`,
		Bug: "the Redis store waits only for the replicas connected when it checked the server: a fence write is acknowledged before a replica attached since has it, and a failover to that replica re-admits the zombie", Safety: true},

	// The shard router: a key's old fence is retired before a placement moves it, and nothing
	// brings a retired fence back. Guards on SQLite.
	{Name: "RetiredFenceRecovered", Package: "fence/shard", Guards: []string{"TestRecoverRefusedOnRetiredFence", "TestMoveDuringBatchNeverWritesOldShard"}, Want: `ecover of the retired fence: got <nil>|Recover of a retired fence: got <nil>`,
		Bug: "the router lets a verified owner recover a retired fence: a member holding an old placement raises its era and writes on the shard its key left", Safety: true},
	{Name: "RetiredClaimantAccepted", Package: "fence/shard", Guards: []string{"TestRetiredClaimantRefused"}, Want: `by a retired fence's claimant: got <nil>`,
		Bug: "the router accepts the retired fences' reserved claimant from a caller, who could then hold a retired fence's token", Safety: true},
	{Name: "PublishWithoutRetire", Package: "fence/shard", Guards: []string{"TestPublishRefusesMoveOfLiveFence"}, Want: `Publish moving a live fence: got <nil>`,
		Bug: "a placement moving a key is published while the key's old fence still admits its owner's writes", Safety: true},
	{Name: "PublishBeforeCopy", Package: "fence/shard", Guards: []string{"TestPublishRefusesMoveBeforeTheNewShardHoldsThePosition"}, Want: `Publish moving a key its new shard has not caught up with: got <nil>`,
		Bug: "a placement moving a key is published while the new shard's fence is behind the old one's position: the partition resumes there from an earlier offset", Safety: true},
	{Name: "RetiredEpochZero", Package: "fence/shard", Guards: []string{"TestRecoverRefusedOnRetiredFence", "TestMoveDuringBatchNeverWritesOldShard", "TestRetireNeverClaimedFence"}, Want: `claim (of a retired|in the retired).*got <nil>|= <nil>, want stale`,
		Bug: "a retired fence's token has epoch 0: any claim in its era outranks it and writes on the shard its key left", Safety: true},
	{Name: "ResetUnretires", Package: "fence/shard", Guards: []string{"TestResetTopicKeepsRetiredFencesRetired", "TestTopicResetLeavesNoWindowToClaimAMovedKeysOldFence"}, Want: `after the reset = .*want retired|claimed .* during the reset and committed a write there`,
		Bug: "a topic reset moves a sealed fence (the retired fence of a moved key) to a new era without a claimant, claimable again on the shard the key left", Safety: true},
	{Name: "ApplyByRuleOnly", Package: "fence/shard", Guards: []string{"TestPublishRefusesMoveOfLiveFence", "TestMoveDuringBatchNeverWritesOldShard"}, Want: `got <nil>, want shard: key moved|routes .* to a after reading placement 2`,
		Bug: "the router ignores a placement's entries: moved keys are routed by the rule to the shard they left", Safety: true},
	{Name: "PublishBelowRetired", Package: "fence/shard", Guards: []string{"TestPublishRefusesMoveOfLiveFence"}, Want: `to a fence not above the retired one: got <nil>`,
		Bug: "a placement moving a key is published while the new shard's fence is not above the old one's retired token: the old placement's highest tokens are accepted there", Safety: true},
	{Name: "MoveCopiesFenceToken", Package: "fence/shard", Guards: []string{"TestMoveRefusesOldPlacementTokensOnBothShards"}, Want: `zombie's Apply on b: got <nil>`,
		Bug: "a move seeds the new shard's fence with the old shard's live token (a copy of the fence row): the old owner's frozen batch commits on the new shard", Safety: true},
	{Name: "SeededClaimedByOldPlacement", Package: "fence/shard", Guards: []string{"TestMoveBackRefusesOldPlacementClaimsBetweenSeedAndCopy"}, Want: `during the move back, placement 1's member claimed`,
		Bug: "the router lets a member routing by a placement older than a move back claim the fence the move seeded on the key's old shard before the placement is stored: it writes on a shard the key does not live on", Safety: true},
	{Name: "SeedNotSealed", Package: "fence/shard", Guards: []string{"TestMoveBackInterruptedAfterItsSeedThenATopicResetRefusesOldPlacementClaims"}, Want: `after a topic reset during the interrupted move back, placement 1's member claimed`,
		Bug: "a move seeds the new shard's fence with epoch 0: a topic reset before the placement is published moves it to a new era without the seed's claimant, and a member of an older placement that puts the key there claims it and writes", Safety: true},
	{Name: "MoveCopiesUncheckable", Package: "fence/shard", Guards: []string{"TestMoveAfterTopicResetWaitsForABatchThenCopiesTheRows", "TestMoveBackWaitsForABatchAndKeepsTheDeliveredMarks"}, Want: `want ErrConflict before any copy`,
		Bug: "a move whose copy no position can tell (the old fence reset to no position, or a key going back to a shard at the same position) goes ahead and skips the copy: the new shard resumes without the partition's rows, or its relay sends again what the other shard's relay delivered", Safety: true},
	{Name: "MovedRefusalIsRegression", Package: "fence/shard", Guards: []string{"TestConsumerFollowsAMove"}, Want: `timed out waiting for every record after the move`,
		Bug: "the consumer takes a write refused by a fence retired for a move for a regression: without RecoverRegressions the partition stops, and with it the owner retries a recovery against the old database's token", Liveness: true},
	{Name: "MoveOutboxWithoutCursor", Package: "cmd/baton", Guards: []string{"TestPlacementShowAndMove"}, Want: `no rows in result set|want 6`,
		Bug: "baton placement move copies a partition's undelivered outbox rows without its cursor: the new shard hands out the old shard's sequences again", Safety: true},

	// The fence's stores and lease sources. Their guards need the real service (ZooKeeper,
	// PostgreSQL): where it is absent the guard skips and the runner reports the mutant broken,
	// and CI (CI set) fails the guard instead.
	{Name: "BulkAdvanceOwnTransaction", Package: "fence/pgfence/pgbulk", Guards: []string{"TestSinkRollsBackTheLazyAdvanceWithTheData"}, Want: `the fence committed at position \d+ while the data rolled back`,
		Bug: "pgbulk's lazily advanced fence (a handler writing through Exec, QueryRow or CopyFrom) advanced in a transaction of its own: it commits while the data rolls back", Safety: true},
	{Name: "PgAdvanceUnconditional", Package: "fence/pgfence", Guards: []string{"TestConformance/LowerTokenRefused"}, Want: `error = <nil>, want ErrStale`,
		Bug: "pgfence's advance is an unconditional upsert (its WHERE compares neither the token nor the position): a zombie's write commits", Safety: true},
	{Name: "PipeRefusalDropped", Package: "fence/pgfence/pgbulk", Guards: []string{"TestSinkStatementsAfterARefusedFenceNeverCommit"}, Want: `a statement queued after a refused fence committed`,
		Bug: "pgbulk's pipelining transaction forgets the fence's refusal: what the handler queues after it is sent and commits, without the fence advance", Safety: true},
	{Name: "PipeConnKeepsRefusedTransactionUsable", Package: "fence/pgfence/pgbulk", Guards: []string{"TestSinkZombieHandlerStopsAtItsFirstWriteThroughConn"}, Want: `its write through Conn succeeded under a refused fence`,
		Bug: "a refused fence sent by the pipelining transaction's Conn leaves the transaction usable: a zombie's statements on the raw connection succeed (they roll back) and its handler goes on to its side effects", Safety: true},
	{Name: "PipeStatementsBeforeFence", Package: "fence/pgfence/pgbulk", Guards: []string{"TestSinkZombieQueuedStatementsCommitNothing"}, Want: `a zombie's queued write committed`,
		Bug: "pgbulk's first flush sends the handler's queued statements ahead of the fence statement: they run before the fence row's lock, and the fence's result is read from the handler's first statement, so a zombie's writes commit", Safety: true},
	{Name: "PipeQueueDroppedAtCommit", Package: "fence/pgfence", Guards: []string{"TestApplyQueuedStatementsCommit", "TestApplyQueuedStatementFailureCommitsNothing"}, Want: `the queued statements were not all committed|Apply = <nil>: want the failing statement's check violation`,
		Bug: "pgfence's Apply commits without sending the handler's queued statements: the fence advances over records whose writes (and failures) were dropped", Safety: true},
	{Name: "AdmitReadsAQueuedTag", Package: "fence/pgfence", Guards: []string{"TestAdmitInApplysTransaction"}, Want: `want \[Admitted Duplicate\]`,
		Bug: "Admit reads the command tag of its statement with Exec, which the handler's pipelining transaction only queues: an admitted entity is reported a duplicate and its record dropped", Safety: true},
	{Name: "PipeReadBeforeQueuedWrites", Package: "fence/pgfence", Guards: []string{"TestApplyReadSeesQueuedWrites"}, Want: `QueryRow after two queued writes read ""`,
		Bug: "a read in the handler's pipelining transaction runs before the statements queued ahead of it"},
	{Name: "PipeExecWithoutArgumentsUnflushed", Package: "fence/pgfence", Guards: []string{"TestApplyExecWithoutArgumentsRunsAfterTheQueuedOnes"}, Want: `ran before the statement queued ahead of it`,
		Bug: "an Exec without arguments in the handler's pipelining transaction runs before the statements queued ahead of it, which then overwrite what it wrote at the commit (and, over pgbulk, before the fence statement)", Safety: true},
	{Name: "ZkTokenFromDataVersion", Package: "fence/lease/zklease", Guards: []string{"TestTokenIsTheNodeCzxid"}, Want: `its epoch is not its node's czxid`,
		Bug: "zklease's token taken from the node's data version, not its czxid: every holder gets the same token", Safety: true},

	// The auditor (baton audit): each check's comparison removed.
	{Name: "AuditLossNotJudged", Package: audit, Guards: []string{"TestSkippedRecordsDeletedBeforeApplied/sqlite"}, Want: `no skipped violation "records deleted before they were applied"`,
		Bug: "the auditor does not compare the log start with the sink's position: data loss unreported"},
	{Name: "AuditCommittedAheadNotJudged", Package: audit, Guards: []string{"TestSkippedCommittedAheadOfPosition/sqlite"}, Want: `no skipped violation "committed offset ahead"`,
		Bug: "the auditor does not compare the committed offset with the sink's position"},
	{Name: "AuditTokenDecreaseNotJudged", Package: audit, Guards: []string{"TestTokensMovedBackByHand/sqlite"}, Want: `no tokens violation "stored token went back"`,
		Bug: "the auditor does not compare a stored token with the one observed before"},
	{Name: "AuditOutboxGapNotJudged", Package: audit, Guards: []string{"TestOutboxRowDeleted/sqlite"}, Want: `no outbox violation "outbox row missing above the cursor"`,
		Bug: "the auditor does not count the outbox rows above the cursor against the sequences allocated"},
	{Name: "AuditCursorPastDeliveryNotJudged", Package: audit, Guards: []string{"TestOutboxCursorPastUndeliveredRows/sqlite"}, Want: `no outbox violation "cursor passed a row with no copy"`,
		Bug: "the auditor does not look for the copies of the rows the cursor counts as delivered"},
	{Name: "AuditUnallocatedCopyNotJudged", Package: audit, Guards: []string{"TestDeliveryForgedCopy/sqlite"}, Want: `no delivery violation "copy of a sequence the outbox never allocated"`,
		Bug: "the auditor does not compare a copy's sequence with the outbox's last allocated one"},
	{Name: "AuditFirstCopyOrderNotJudged", Package: audit, Guards: []string{"TestDeliveryForgedCopy/sqlite"}, Want: `no delivery violation "first copy's token below"`,
		Bug: "the auditor does not compare a first copy's token with an earlier sequence's"},
	{Name: "AuditInboxDecreaseNotJudged", Package: audit, Guards: []string{"TestInboxAdmissionMovedBack/sqlite"}, Want: `no inbox violation "inbox admission went back"`,
		Bug: "the auditor does not compare an admission's sequence with the one observed before"},
	{Name: "AuditStallNotJudged", Package: audit, Guards: []string{"TestLivenessCommitsStopped/sqlite"}, Want: `no liveness violation "position has not moved"`,
		Bug: "the auditor does not compare how long a lagging partition's position stood still with the bound"},
	{Name: "AuditOwnershipNotJudged", Package: audit, Guards: []string{"TestOwnershipClaimantNotTheOwner/sqlite", "TestOwnershipCommitWithoutFence/sqlite"}, Want: `no ownership violation "(not the partition's owner|no fence claims)"`,
		Bug: "the auditor does not compare a fence's claimant with the group's owner, nor look for commits on partitions no fence claims"},
	{Name: "AuditRetiredFenceJudged", Package: audit, Guards: []string{"TestAuditAcrossShardsRetiredFenceNotJudged"}, Want: `violation: skipped: committed offset ahead of the sink's position .* on shard b`,
		Bug: "the auditor judges a fence fence/shard retired when its key moved: the position where the key left its shard reads as records skipped"},
	{Name: "AuditRecreatedTopicJudged", Package: audit, Guards: []string{"TestRecreatedTopicNotJudgedUntilReset/sqlite"}, Want: `violations \[skipped: sink position past the end of the log`,
		Bug: "the auditor compares the positions of a recreated topic's old incarnation, held until its reset, with the new incarnation's log"},
}

func init() {
	for i := range All {
		if All[i].Group == "" {
			All[i].Group = GroupFull
			if All[i].Safety {
				All[i].Group = GroupSafety
			}
		}
	}
}

// Lookup returns the mutant named name.
func Lookup(name string) (Mutant, bool) {
	for _, m := range All {
		if m.Name == name {
			return m, true
		}
	}
	return Mutant{}, false
}

// Patch returns the mutant's patch, a unified diff relative to the module's root.
func (m Mutant) Patch() ([]byte, error) {
	return patches.ReadFile(m.Package + "/" + m.Name + ".patch")
}

// PatchFiles lists every patch file in this directory, as Package/Name.patch.
func PatchFiles() ([]string, error) {
	var out []string
	err := fs.WalkDir(patches, ".", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			out = append(out, p)
		}
		return err
	})
	return out, err
}

// ModuleRoot returns the directory holding the go.mod of the module dir is in.
func ModuleRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("mutants: no go.mod above the current directory")
		}
		dir = up
	}
}

// Copy copies the files of the checkout at root that git knows or would add (tracked, and
// untracked but not ignored) into dst, a scratch directory.
func Copy(root, dst string) error {
	out, err := exec.Command("git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		return fmt.Errorf("mutants: git ls-files in %s: %w", root, err)
	}
	for _, rel := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if rel == "" {
			continue
		}
		if err := copyFile(filepath.Join(root, rel), filepath.Join(dst, rel)); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	fi, err := os.Lstat(src)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // tracked, deleted in the checkout
	}
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		return os.Symlink(target, dst)
	}
	if !fi.Mode().IsRegular() {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// Apply applies the mutant's patch to the copy of the module in dir.
func (m Mutant) Apply(dir string) error { return m.gitApply(dir) }

// Revert undoes Apply.
func (m Mutant) Revert(dir string) error { return m.gitApply(dir, "-R") }

func (m Mutant) gitApply(dir string, args ...string) error {
	p, err := m.Patch()
	if err != nil {
		return err
	}
	cmd := exec.Command("git", append(append([]string{"apply", "--whitespace=nowarn"}, args...), "-")...)
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(p)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mutants: git apply %s %s: %w\n%s", strings.Join(args, " "), m.Name, err, out)
	}
	return nil
}

// BuildBaton builds cmd/baton with the named mutant applied, from a scratch copy of the
// module at root, into the executable out.
func BuildBaton(ctx context.Context, root, name, out string) error {
	m, ok := Lookup(name)
	if !ok {
		return fmt.Errorf("mutants: no mutant %q", name)
	}
	dir, err := os.MkdirTemp("", "baton-mutant-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := Copy(root, dir); err != nil {
		return err
	}
	if err := m.Apply(dir); err != nil {
		return err
	}
	out, err = filepath.Abs(out)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/baton")
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mutants: go build ./cmd/baton with %s: %w\n%s", name, err, b)
	}
	return nil
}
