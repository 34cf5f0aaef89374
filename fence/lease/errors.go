package lease

import "errors"

var (
	// ErrLost means ownership ended without [Lease.Release]: the token source expired or
	// revoked the grant (a holder paused past its TTL, a partition from the service, a session
	// killed by an operator), or the holder could no longer prove it was alive. The lease's
	// context ends with a cause wrapping it and the source's reason.
	ErrLost = errors.New("lease: ownership lost")

	// ErrReleased means the holder gave the lease up with [Lease.Release]. The lease's context
	// ends with it as the cause.
	ErrReleased = errors.New("lease: released")
)
