package consumer

func modelFindings() []modelFinding {
	return []modelFinding{
		{name: "1-equal-token-race", proto: consumerMutant(mutantEqualTokenAccepted), allow: faultsOf(stepStaticReplace), want: "two writers"},
		{name: "2-blind-proof", proto: consumerMutant(mutantBlindHeartbeat), allow: faultsOf(stepRebalance, stepLoadStart), want: "did not own"},
		{name: "2-stale-claim-is-regression", proto: consumerMutant(mutantStaleIsRegression), allow: faultsOf(stepRebalance), want: "never proved"},
		{name: "2-no-verify-after-claim", proto: mutantProtocol(mutNoVerifyAfterClaim), allow: faultsOf(stepRebalance, stepRecreate), want: "two writers"},
		{name: "2-stale-write-stops", proto: mutantProtocol(mutStaleWriteStops), allow: faultsOf(stepRebalance, stepRecreate), want: "liveness"},
		{name: "3-recover-conflict", proto: consumerMutant(mutantRecoverSameExpected), allow: faultsOf(stepRecreate, stepWorkerReplyLost), want: "liveness"},
		{name: "4-retained-idle", proto: mutantProtocol(mutRetainedIdles), allow: faultsOf(stepStaticReplace, stepRebalance), want: "liveness"},
		{name: "5-topic-unchecked", proto: consumerMutant(mutantTopicUnchecked), allow: faultsOf(stepTopicRecreate, stepRebalance), want: "skipped", topics: true},
		{name: "5-reset-before-compare", proto: consumerMutant(mutantTopicNotConfirmed), allow: faultsOf(stepTopicRecreate, stepRebalance), want: "liveness", topics: true},
		{name: "5-batch-topic-unchecked", proto: consumerMutant(mutantBatchTopicUnchecked), allow: faultsOf(stepTopicRecreate), want: "skipped", topics: true},
		{name: "14-handover-unproven", proto: consumerMutant(mutantHandoverUnproven), allow: faultsOf(stepStaticReplace), want: "never proved"},
		{name: "14-handover-is-regression", proto: consumerMutant(mutantHandoverIsRegression), allow: faultsOf(stepStaticReplace), want: "liveness", norec: true},
		{name: "14-era-moved-is-regression", proto: consumerMutant(mutantEraMovedIsRegression), allow: faultsOf(stepStaticReplace, stepRebalance, stepWorkerReplyLost), want: "liveness", norec: true},
		{name: "7-growth-unheld", proto: consumerMutant(mutantGrowthUnheld), allow: faultsOf(stepGrow), want: "before the operator acknowledged the growth", topics: true},
	}
}
