package pgfence

import "errors"

// ErrCommitUnknown means a commit was sent but its outcome is unknown: the connection failed
// or the context ended before the server answered, so the transaction may or may not have
// committed. Retry the same batch: if it had committed, the retry fails with
// fence.ErrDuplicate, which is the proof; otherwise the retry applies it.
// Commit failures whose outcome is known (the server refused the commit, or pgconn reports
// that nothing was sent: pgconn.SafeToRetry) are returned without it.
var ErrCommitUnknown = errors.New("pgfence: commit outcome unknown")
