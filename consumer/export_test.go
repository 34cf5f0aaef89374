package consumer

// DeadLetterHeaders exposes deadLetterHeaders to the external tests (the fuzzer).
var DeadLetterHeaders = deadLetterHeaders

// MaxDeadLetterReason exposes the bound of the baton.dlq.reason header.
const MaxDeadLetterReason = maxDeadLetterReason
