// Package partition is the identity of a Kafka partition in Baton, and nothing else.
//
//   - [ID] names a partition ("orders/3"); [Of] reads it from a *kgo.Record; [ParseID] reads
//     the text form back; [ID.Key] turns it into the fence.Key of a consumer group.
//   - [RecordError] names one failed record of a partition by ID and offset and wraps the
//     cause: a consumer handler returns it (consumer.Batch.Fail) to name a poison record.
//   - Bad input (an invalid ID, an option out of range) fails with errors wrapping
//     fence.ErrInvalid, here and in partition/ring.
//
// Routing lives in partition/ring, a kgo.Partitioner that hashes keys onto a consistent ring of
// partitions.
//
// # Routing never decides who may write
//
// Write authority in Baton comes from one place: the consumer group's assignment of a
// partition, captured as a fence.Token when the assignment arrives and checked by the sink
// where the data lives. Nothing in this package or its subpackages grants, checks or extends
// it. A hash ring answers "where should this key go", never "who may write this key": two
// processes that disagree about a ring (different versions, different partition counts) route
// differently, but the fence still refuses every write that is not under the current owner's
// token.
package partition
