// Package lease fences work that is not driven by Kafka partitions (a scheduled job, a leader
// task, a per-tenant migration) with the tokens of a lock service, so that a holder that lost
// its lock without knowing it cannot write after its successor has.
//
// A [Source] (etcdlease, zklease, pglease) grants ownership of a named resource as a [Lease]:
// the [fence.Key] to write under, the [fence.Token] the service issued with the grant, and a
// context that ends when ownership ends (the etcd concurrency package's Session is the model).
// The holder writes through any [fence.Sink] with that token: [Claim] once, then [Apply] per
// write. The outbox works the same way: append inside Apply's function, in its transaction,
// with the lease's key and token.
//
// # Why a lease needs the fence
//
// A lease is a promise about time: the service gives the resource to someone else once the
// holder has been silent for the TTL. A holder paused past it (GC, a frozen VM, SIGSTOP, a slow
// network) wakes up still believing it owns the resource, and checking the lease before
// writing cannot help: the pause can fall between the check and the write. So the guarantee is
// the sink's, not the lease's: each grant carries a token higher than every earlier grant's,
// the successor's [Claim] raises the fence to its token, and from then on the sink refuses,
// atomically and next to the data, every write under a lower token with a *[fence.StaleError].
// The lease's context is the hint that stops a holder early; [Apply] binds it to the write, so
// a loss noticed mid-write cancels the write, and a write that ends after the loss is not
// committed even by a store that ignores its context at commit time.
//
// # Keys
//
// A resource maps to the fence key {Group: "lease:<source>", Topic: resource, Partition: 0}
// (see [Key]); each source's Group option changes the group. Tokens of different sources are
// not comparable (an etcd revision, a ZooKeeper zxid, a PostgreSQL counter), so each source
// fences under its own group, and the key never collides with a Kafka consumer group's keys
// as long as no consumer group is named "lease:...".
//
// # Tokens that go backwards
//
// A token source can regress: an etcd cluster restored from an old snapshot re-issues
// revisions, a ZooKeeper ensemble whose data was wiped restarts its zxids, a PostgreSQL replica
// promoted without the last acknowledged commits re-issues counter values. The sink then holds
// a higher token than the rightful new holder presents, and refuses it as stale: a regression
// is never accepted silently. Recovery is explicit, as for consumer groups: prove who the
// current holder is, call [fence.Sink.Recover] for the affected keys (recorded, with a reason),
// and raise the source's Era option so its tokens belong to the new era.
//
// # What is not covered
//
//   - Fencing protects only the sink that checks the token. Effects outside it (an email, an
//     API call) go through the fenced outbox, or must be idempotent.
//   - Position is the caller's: [Apply] needs a position higher than the stored one, like
//     [fence.Sink.Apply]; a lease writer usually counts its writes from the claimed position.
//
// Every source runs the same real-service suite (internal/testkit/leasetest): a holder frozen
// with SIGSTOP past its lease, and a lease lost while a write is in flight, in separate
// processes.
package lease
