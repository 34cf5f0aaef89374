// Package ring routes keys with consistent hashing: [Partitioner] is a kgo.Partitioner that
// hashes keys onto a consistent ring of partitions.
//
// Growing a topic from N to M partitions moves about (M-N)/M of the keys (24% from 12 to 16,
// where Kafka's murmur2 % n moves 75%). Keys that move still break per-key order across the
// change (records before it sit in the old partition), so growing a topic needs the usual care;
// the partitioner only makes it touch fewer keys. Its routing function is fixed (xxhash64, the
// ring's parameters, the consistent module's version) and must be the same in every producer
// of a topic. Records without a key are spread as kgo.StickyPartitioner spreads them.
//
// Routing never decides who may write: that is the consumer group's assignment and the fence's
// token. Options are [Option] values (func(*config) error); [NewPartitioner] reports every
// invalid or nil option at once, each wrapping fence.ErrInvalid.
package ring
