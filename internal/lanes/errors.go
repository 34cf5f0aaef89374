package lanes

import "errors"

// A negative offset is fence.ErrInvalid.
var (
	// ErrOffsetOrder means [Tracker.Start] was given an offset that is not above every offset
	// started before: a partition's records must be started in log order.
	ErrOffsetOrder = errors.New("lanes: offset started out of order")

	// ErrUnknownOffset means [Tracker.Done] was given an offset that is not pending: never
	// started, or already done.
	ErrUnknownOffset = errors.New("lanes: offset not pending")
)
