// Package fencecheck holds the fence rules and argument checks of this module's fence.Sink
// (and fence.KeyedSink) implementations, written once, so that every store agrees about what is
// stale, duplicate or invalid. An author of a store outside this module implements the same
// rules, as package fence documents them, and proves it with the conformance suite
// fence/fencetest.
//
// A store validates its arguments before any I/O ([ValidateClaim], [ValidateWrite],
// [ValidateAdmit], [ValidateRecover], [ValidateIdentifier]; each fails with an error wrapping
// fence.ErrInvalid), applies its conditional write, and, when the write matched nothing,
// classifies the refusal from the state it stored with [CheckClaim], [CheckAdvance] or
// [CheckAdmit]: a *fence.StaleError for a lower token (or, for a claim, an equal token held by
// another claimant), fence.ErrNotClaimed for a write under a token higher than the stored one,
// fence.ErrDuplicate for a batch already applied, fence.ErrOverlap for a batch that spans the
// stored position, fence.ErrInvalid for a token of an era the fence never reached. The rules
// are pure functions of the stored state and the arguments, so a model checker can call them. A store whose
// conditional write is this rule in SQL (as pgfence's and sqlitefence's WHERE clauses are) and
// that classifies with these functions reports exactly what memfence reports; the conformance
// suite fence/fencetest checks it.
//
// The package depends only on package fence and the standard library.
package fencecheck
