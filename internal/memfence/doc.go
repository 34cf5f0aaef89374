// Package memfence is an in-memory [fence.Sink] and [fence.KeyedSink] for this module's fast
// tests. It is NOT durable: everything it holds, the fences included, is lost when the process
// ends, so it cannot protect real data from a zombie writer that outlives it. A user's own
// tests use fence/sqlitefence on a file in a temporary directory.
//
// Within a process it keeps the same guarantees as the durable stores, and runs the same
// conformance suite (fence/fencetest):
//
//   - A [Tx] stages its changes (fence advances, keyed admissions and the caller's own
//     key/value writes) and makes them visible all at once on [Tx.Commit], or drops them on
//     [Tx.Rollback].
//   - A transaction that advanced a fence, or admitted an entity, holds that key until it ends,
//     like a row lock: Claim, Apply, Advance, Recover and Admit on the same key wait for it and
//     then judge against what it committed. So a lower token can never commit after a higher
//     one was accepted. Load, Recoveries and [Store.Get] never wait; they read committed data.
//   - Waiting respects the context. There is no deadlock detection: two transactions that take
//     the same keys in opposite order wait until one's context ends.
//
// The store starts no goroutines.
package memfence
