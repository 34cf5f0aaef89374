package partition

import "fmt"

// RecordError names one record of a partition that failed, by partition and offset (and key),
// and unwraps to the cause. It is Baton's one record error: a consumer handler returns it (through
// consumer.Batch.Fail) to name a poison record so the consumer can dead-letter exactly that
// record.
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
