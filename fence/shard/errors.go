package shard

// ErrMoved means a key does not live on the shard a call reached: its fence there was retired
// because the key moved to another shard (or is being moved), or a transaction of one shard
// was used for a key placed on another. Nothing was written. The router has re-read the
// placement; a claim started afresh reaches the key's shard.
//
// A Baton consumer recognizes it (its Moved method reports true) among a sink's refusals: the
// partition's worker waits for the move's publication and claims the partition afresh,
// through the router, on the shard the new placement names, instead of treating the refusal
// as a regression or retrying the refused step.
var ErrMoved error = movedError{}

type movedError struct{}

func (movedError) Error() string { return "shard: key moved to another shard" }

// Moved marks the error for callers that classify a sink's errors without importing this
// package (the consumer).
func (movedError) Moved() bool { return true }
