package redisfence

import "errors"

var (
	// ErrNotDurable means the server's settings can lose a write it acknowledged (appendonly
	// no; appendfsync everysec or no; no-appendfsync-on-rewrite yes; an allkeys-* eviction
	// policy), or the store cannot read them (CONFIG is disabled or not permitted), or a
	// Redis Cluster has replicas the store cannot wait for, or the user may not publish to the
	// channel the wait needs, and [AllowLosingAcknowledgedWrites] was not given. A lost fence advance lets a writer that
	// only it had outranked write again.
	//
	// On a standalone server, a fence write also fails with it when its replicas did not all
	// confirm the write within a second, when more replicas are connected after it than it
	// waited for, or when the PUBLISH that lets WAIT cover it was refused: the write may be on
	// the primary (a retry is answered fence.ErrDuplicate once they confirm it), but it is not
	// acknowledged, since a failover to a replica that lacks it would lose it. Retry.
	ErrNotDurable = errors.New("redisfence: the server may lose acknowledged writes")

	// ErrCrossSlot means a transaction on a Redis Cluster touches keys in more than one hash
	// slot, which one script cannot do. Nothing was run. Put the partition's [HashTag] in the
	// keys written with its fence.
	ErrCrossSlot = errors.New("redisfence: keys in more than one hash slot")

	// ErrCommand means a queued command would fail on the keys as they are (a key of another
	// type, a field that is not an integer): the whole transaction was refused before anything
	// was written.
	ErrCommand = errors.New("redisfence: a command would fail")
)
