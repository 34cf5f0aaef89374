package partition

import (
	"fmt"

	"github.com/batonhq/baton/fence"
)

// ErrInvalid means bad input: an invalid [ID], and in partition/lanes and partition/ring an
// option out of range, a nil callback, a batch whose records belong to different partitions or
// whose offsets do not increase. It is the same sentinel as [fence.ErrInvalid], so one
// errors.Is check covers every package.
var ErrInvalid = fence.ErrInvalid

// RecordError names one record of a partition that failed, by partition and offset (and key),
// and unwraps to the cause. It is Baton's one record error: lanes.Lanes.Run returns it when its
// callback fails for a record, and a consumer handler returns it (through consumer.Batch.Fail)
// to name a poison record so the consumer can dead-letter exactly that record.
type RecordError struct {
	ID     ID
	Offset int64
	Key    []byte
	Err    error
}

func (e *RecordError) Error() string {
	return fmt.Sprintf("partition: record %s@%d: %v", e.ID, e.Offset, e.Err)
}

// Unwrap returns the cause.
func (e *RecordError) Unwrap() error { return e.Err }
