// Package partition names Kafka partitions and routes keys: to lanes inside one partition's
// worker, and to partitions when producing.
//
// # Routing never decides who may write
//
// Write authority in Baton comes from one place: the consumer group's assignment of a
// partition, captured as a fence.Token when the assignment arrives and checked by the sink
// where the data lives. Nothing in this package grants, checks or extends it. A hash ring
// answers "where should this key go", never "who may write this key": two processes that
// disagree about a ring (different versions, different partition counts) route differently,
// but the fence still refuses every write that is not under the current owner's token.
//
// # What is here
//
//   - [ID] names a partition ("orders/3"); [Of] reads it from a *kgo.Record; [ID.Key] turns it
//     into the fence.Key of a consumer group.
//   - [Lanes] runs one partition's batch on a few goroutines, spreading records by key with
//     consistent hashing (bounded loads): one key's records run in offset order on one lane,
//     different keys in parallel, all under the partition's single token. [Lanes.Run] returns
//     only when every goroutine it started has returned, stops the batch at the first failure,
//     and reports the committable offset: the end of the contiguous prefix of completed records,
//     the only position the worker may advance its fence and commit to.
//   - [Tracker] computes that position for records that complete out of order. It belongs to
//     one goroutine.
//   - [ConsistentPartitioner] is a kgo.Partitioner that hashes keys onto a consistent ring of
//     partitions, so growing a topic from N to M partitions moves about (M-N)/M of the keys
//     (24% from 12 to 16, where Kafka's murmur2 % n moves 75%). Keys that move still break
//     per-key order across the change (records before it sit in the old partition), so
//     growing a topic needs the usual care; the partitioner only makes it touch fewer keys.
//     Its routing function is fixed (xxhash64, the ring's parameters, the consistent module's
//     version) and must be the same in every producer of a topic.
//
// Records without a key run on lane 0 in a partition worker, and are spread like
// kgo.StickyPartitioner spreads them by the partitioner.
package partition
