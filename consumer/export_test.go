package consumer

// DeadLetterHeaders exposes deadLetterHeaders to the external tests (the fuzzer).
var DeadLetterHeaders = deadLetterHeaders
