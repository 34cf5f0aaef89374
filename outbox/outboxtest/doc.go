// Package outboxtest is the conformance suite of outbox stores, the outbox counterpart of
// fence/fencetest: every store (pgoutbox against a real PostgreSQL, sqliteoutbox) runs
// [Run] from its tests, and a store of your own should too.
//
// The suite checks the rules the relay and the fence protocol rely on:
//
//   - Fenced append: Append writes only if the source partition's fence stores exactly the
//     presented token. A higher stored token fails with a *fence.StaleError (the caller is a
//     zombie), another token or no fence row with outbox.ErrUnfenced; either way nothing is
//     written. A transaction that advances the fence to a new token may append under it.
//   - Gap-free sequences in commit order: concurrent appenders of one source get 1, 2, 3...
//     with no hole and no repeat, each transaction's rows consecutive; a rolled-back append
//     leaves no gap.
//   - Fenced relay: Pending and MarkDelivered of a deposed owner fail with a
//     *fence.StaleError and mark nothing; of an unclaimed source, or under a token the fence
//     does not store, with outbox.ErrUnfenced.
//   - Bad input (outbox.ErrTooLarge, ErrInvalid) is refused
//     before any statement is sent, and nothing is written.
//   - Cleanup deletes delivered rows only, and never lets a sequence or idempotency key be
//     handed out again.
//   - Fenced dead letters: DeadLetter succeeds only for the owner's exact token (a deposed
//     owner's fails with a *fence.StaleError, others with outbox.ErrUnfenced) and only for the
//     first pending row (outbox.ErrInvalid otherwise); the row is kept with its reason and the
//     dead-lettering token, never pending again, and its sequence is never handed out again.
//
// Every case runs under a deadline ([Timeout]) and rolls back the transactions it opened in
// t.Cleanup, so a broken store fails in seconds instead of hanging. The suite's own tests
// prove each case can fail: they run it against mutants, wrappers of sqliteoutbox that break
// one rule each, and require every mutant to be caught by the cases named for it.
package outboxtest
