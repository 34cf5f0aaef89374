// Package lanes runs one partition's batch on a few goroutines, spreading records by key.
//
//   - [Lanes] maps keys to lanes with consistent hashing (bounded loads, partition/ring): one
//     key's records run in offset order on one lane, different keys in parallel, all under the
//     partition's single token. [Lanes.Run] returns only when every goroutine it started has
//     returned, stops the batch at the first failure (a *partition.RecordError), and reports
//     the committable offset: the end of the contiguous prefix of completed records, the only
//     position the worker may advance its fence and commit to (fence.NoPosition if none).
//   - [Tracker] computes that position for records that complete out of order. It belongs to
//     one goroutine. The consumer's Lanes option (consumer.Lanes) uses it
//     for the prefix its single writer applies; that runtime mode binds a key to the
//     least-loaded lane while the key has records in flight, rather than hashing it, so that
//     lanes are balanced by records when a partition holds few keys.
//
// Records without a key run on lane 0. Lanes never decide who may write: they run inside the
// worker that owns the partition, under the token captured at assignment, and the fence check
// happens where the data lives. Records above the committable offset may have completed too
// and are delivered again when the partition resumes, so their effects must tolerate a replay.
//
// Options are [Option] values (func(*config) error); [New] reports every invalid or nil option
// at once, each wrapping partition.ErrInvalid.
package lanes
