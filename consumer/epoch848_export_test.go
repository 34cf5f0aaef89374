package consumer

// ProveOwned848 and CommitProof848 expose the KIP-848 proof's parts to the external tests,
// which call them for a member other than the client's own (a fenced one).
var (
	ProveOwned848  = proveOwned
	CommitProof848 = commitProof848
)
