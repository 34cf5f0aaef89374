// Package lanes is the bookkeeping of the consumer's lanes (consumer.Lanes): [Tracker] finds
// the committable position of a partition whose records complete out of order, the end of the
// contiguous prefix of completed records, the only position the partition's single writer may
// apply and commit to (fence.NoPosition if none). It belongs to one goroutine.
//
// Lanes never decide who may write: they run inside the worker that owns the partition, under
// the token captured at assignment, and the fence check happens where the data lives.
package lanes
