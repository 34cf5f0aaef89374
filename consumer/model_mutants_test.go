package consumer

// modelMutants are the model's own broken variants of the protocol (modelMutant), each with
// the faults that expose it and what the model must report.
func modelMutants() []modelCase {
	return []modelCase{
		{name: "no-verify-after-claim", proto: mutantProtocol(mutNoVerifyAfterClaim), allow: faultsOf(stepRebalance, stepRecreate), want: "two writers"},
		{name: "stale-write-stops", proto: mutantProtocol(mutStaleWriteStops), allow: faultsOf(stepRebalance, stepRecreate), want: "liveness"},
		{name: "retained-idle", proto: mutantProtocol(mutRetainedIdles), allow: faultsOf(stepStaticReplace, stepRebalance), want: "liveness"},
		{name: "blind-proof", proto: mutantProtocol(mutBlindProof), allow: faultsOf(stepRebalance, stepLoadStart), want: "did not own"},
		{name: "equal-token-takeover", proto: mutantProtocol(mutEqualTokenTakeover), allow: faultsOf(stepStaticReplace), want: "two writers"},
		{name: "batch-topic-unchecked", proto: mutantProtocol(mutBatchTopicUnchecked), allow: faultsOf(stepTopicRecreate), topics: true, want: "skipped"},
	}
}

// modelTargets are narrow explorations of the protocol as it is: each allows only the faults
// that break one rule of the claim decision or the worker, so it fails within a second, with a
// counterexample, when that rule is broken (the patches of internal/testkit/mutants break
// them one at a time).
func modelTargets() []modelCase {
	return []modelCase{
		{name: "equal-token-race", allow: faultsOf(stepStaticReplace)},
		{name: "blind-proof", allow: faultsOf(stepRebalance, stepLoadStart)},
		{name: "stale-claim", allow: faultsOf(stepRebalance)},
		{name: "recover-conflict", allow: faultsOf(stepRecreate, stepWorkerReplyLost)},
		{name: "topic-recreated", allow: faultsOf(stepTopicRecreate, stepRebalance), topics: true},
		{name: "batch-topic", allow: faultsOf(stepTopicRecreate), topics: true},
		{name: "handover-proof", allow: faultsOf(stepStaticReplace)},
		{name: "handover", allow: faultsOf(stepStaticReplace), norec: true},
		{name: "era-moved", allow: faultsOf(stepStaticReplace, stepRebalance, stepWorkerReplyLost), norec: true},
		{name: "growth", allow: faultsOf(stepGrow), topics: true},
	}
}
