package partition

import (
	"errors"
	"fmt"

	"github.com/batonhq/baton/fence"
)

var (
	// ErrInvalid means bad input: an invalid [ID], an option out of range, a nil callback, a batch
	// whose records belong to different partitions or whose offsets do not increase. It is the
	// same sentinel as [fence.ErrInvalid], so one errors.Is check covers both packages.
	ErrInvalid = fence.ErrInvalid

	// ErrOffsetOrder means [Tracker.Start] was given an offset that is not above every offset
	// started before: a partition's records must be started in log order.
	ErrOffsetOrder = errors.New("partition: offset started out of order")

	// ErrUnknownOffset means [Tracker.Done] was given an offset that is not pending: never
	// started, or already done.
	ErrUnknownOffset = errors.New("partition: offset not pending")
)

// RecordError is returned by [Lanes.Run] when the callback fails for a record: it names the
// record so the caller can dead-letter it, and unwraps to the callback's error.
type RecordError struct {
	ID     ID
	Offset int64
	Key    []byte
	Err    error
}

func (e *RecordError) Error() string {
	return fmt.Sprintf("partition: record %s@%d: %v", e.ID, e.Offset, e.Err)
}

// Unwrap returns the callback's error.
func (e *RecordError) Unwrap() error { return e.Err }
