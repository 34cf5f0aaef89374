package consumer

func modelFindings() []modelFinding {
	return []modelFinding{
		{name: "1-equal-token-race", proto: legacyProtocol, allow: faultsOf(stepStaticReplace), want: "applied 2 times"},
		{name: "2-blind-proof", proto: legacyProtocol, allow: faultsOf(stepRebalance, stepLoadStart), want: "era raised"},
		{name: "3-recover-conflict", proto: legacyProtocol, allow: faultsOf(stepRecreate, stepWorkerReplyLost), want: "liveness"},
		{name: "4-retained-idle", proto: legacyProtocol, allow: faultsOf(stepJoin, stepRebalance), want: "liveness"},
	}
}
