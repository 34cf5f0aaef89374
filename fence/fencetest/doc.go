// Package fencetest is the conformance suite every [fence.Sink] implementation runs, the
// in-memory one included. Each case fails if the behaviour it names is broken.
//
// A store's test calls [Run] with a function that opens a fresh, empty store per case:
//
//	func TestConformance(t *testing.T) {
//		fencetest.Run(t, func(t *testing.T) fencetest.Env[*sql.Tx] { ... })
//	}
//
// Cases run in parallel (t.Parallel), so open must give every case its own storage.
//
// What the cases hold a store to, beyond the method docs of [fence.Sink]:
//
//   - Every method, Load and Recoveries included, refuses an invalid key, token, position,
//     reason or keyed identifier with an error wrapping [fence.ErrInvalid], and stores nothing.
//   - Stale wins over duplicate: a lower token at an applied position is [fence.ErrStale].
//   - One claimant per token: of claimants racing to claim the same token exactly one wins;
//     the holder re-claims freely, another claimant is refused as stale (EqualTokenOneClaimant,
//     ClaimRaceOneClaimant).
//   - A write needs exactly the stored token ([fence.ErrNotClaimed] above it) and a batch
//     starting after the stored position ([fence.ErrOverlap] for one that spans it).
//   - A failed Apply (stale, duplicate, invalid, fn or user-write error) leaves the fence and
//     the user data as they were; it does not consume the position or raise the token.
//   - A transaction that advanced a key holds it until it ends: a Claim or Apply of the key
//     from elsewhere waits for it (AdvanceHoldsKeyUntilTxEnds pauses 50 ms to let the waiter
//     get there; a store with a lock or busy timeout shorter than that fails it).
//   - With [Env.Keyed], of N concurrent admissions of one message exactly one is admitted.
//   - With [Env.Table], hostile or over-long names (more than 63 bytes, PostgreSQL's limit)
//     are refused with [fence.ErrInvalid].
//
// Stores that cannot run a case leave its hook nil and the case is skipped with a reason.
//
// A broken store fails the suite quickly instead of hanging it: every call the suite makes
// runs under a 10-second deadline, and every transaction it begins with [Env.Begin] is
// rolled back in t.Cleanup if a failed case left it open (a pgxpool's Close, run by the
// store's own cleanup, would otherwise wait for that connection for ever).
//
// Stores that implement fence.Versioned also run [RunOCC] (occ.go), with its own mutants in
// occ_test.go.
package fencetest
