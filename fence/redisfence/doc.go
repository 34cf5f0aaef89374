// Package redisfence is the fenced sink in Redis, on go-redis v9: it keeps, for each
// (consumer group, topic, partition), the highest accepted token, its claimant and the last
// applied position in Redis next to the caller's data (device shadows in hashes, counters,
// streams), and checks and advances them in the same server-side script that writes the data.
// It implements fence.Sink[*Tx], fence.KeyedSink[*Tx] (an inbox on Redis) and fence.Topics,
// and passes the fencetest conformance suite against a real server. It needs Redis 7 or later
// (scripts with a "#!lua" line).
//
// # Use
//
//	s, err := redisfence.New(client) // a *redis.Client, a failover or a cluster client
//	st, err := s.Claim(ctx, key, token, claimant) // on assignment; resume after st.Position
//	err = s.Apply(ctx, key, token, first, last, func(ctx context.Context, tx *redisfence.Tx) error {
//		tx.HSet("twin:"+redisfence.HashTag(key.Group, key.Topic)+":dev-7", "temp", "21.5")
//		tx.HIncrBy("count:"+redisfence.HashTag(key.Group, key.Topic), "dev-7", 1)
//		return nil
//	})
//
// A [Tx] is a list of write commands (HSET, HINCRBY, XADD, SET, DEL, PEXPIRE); nothing is sent
// until the commit, which is one script: it first checks each fence (exactly the stored token
// and a batch starting after the stored position: fencecheck.CheckAdvance's rule, as in the
// SQL stores' conditional UPDATE) and refuses, writing nothing, a lower token, a token not
// claimed, a batch already applied or one overlapping the stored position; the stored state it
// returns is classified in Go by the rule functions the other stores use (this module's
// internal/fencecheck), so the errors are the other stores'.
// Claims, recoveries and topic identities are single scripts too, with the claim rule in the
// script and the arithmetic (the next era, the next record) in Go. Redis runs one script at a
// time, so a script is atomic and serialized with every other command.
//
// A Redis script does not roll back: a command that fails after an earlier one wrote leaves
// that write. So the commit reads and decides everything before it writes anything: each
// command is checked against the keys as the commands before it leave them (a hash command on
// a string, a field of HINCRBY that is not an integer), and a transaction that would fail is
// refused whole with [ErrCommand]. The "#!lua" line makes a server over its memory limit refuse
// the script before it runs. HINCRBY is limited to integers within ±(2^53-1), which Lua's
// numbers hold exactly; only these commands are offered, because only their failures can be
// foreseen.
//
// [Store.Advance] and [Store.Admit] work in a [Tx] the caller holds ([Store.Begin]). As a row
// lock would, they hold the fence or keyed fence for the transaction until it commits or rolls
// back: claims, recoveries and other transactions of it wait. A hold expires after ten
// seconds, so a caller that died does not block its successor for longer; the hold only
// orders writers, and the commit's check is what refuses a stale one. Admit decides the
// verdict when it is called (the caller needs it to choose its writes), and the commit refuses
// the transaction with fence.ErrConflict if the keyed fence changed after a hold expired.
//
// # Keys and Redis Cluster
//
// For key prefix P (default "baton:", [Prefix]), group g, topic t, partition p, keyed scope s
// and id i, each name escaped (% { } / : as %XX):
//
//	P{g/t}:fence:p         hash era, epoch, pos, claimant
//	P{g/t}:fence:p:hold    the transaction holding the fence
//	P{g/t}:recovery:p      stream of recoveries (from, to, reason)
//	P{g/t}:partitions      set of the partitions with a fence
//	P{g/t}:topic           hash seq, id, partitions: the topic identity
//	P{g/t}:topics          stream of its records
//	P{s}:admit:i           hash era, epoch, seq: a keyed fence; :hold its holder
//
// The hash tag {g/t} ([HashTag]) puts every fence of a topic, its recoveries and its identity
// in one hash slot: resetting a recreated topic moves all its fences in one script, as the
// SQL stores do in one transaction. On a Redis Cluster one script can only touch keys of one
// slot, so the caller's keys written with a fence must carry the same tag, and the topic's
// fenced data lives on one node. The store asks the server (INFO cluster) whether it is a
// cluster; on one, a transaction with keys in more than one slot is refused before it runs
// with [ErrCrossSlot]. A keyed fence is tagged by its scope, so on a cluster an admission
// cannot share a transaction with a partition's fence: the inbox on Redis needs a standalone
// (or failover) server. The caller's keys may not start with the store's prefix.
//
// # Durability
//
// A fence is only as durable as the server that keeps it. Redis acknowledges a script once it
// ran in memory; what a crash then keeps depends on the append-only file, and what a failover
// keeps depends on replication:
//
//   - appendonly yes, appendfsync always: the script is written and fsynced before the reply.
//     A crash, a kill or a power loss of the server loses no acknowledged advance. This is
//     what the store requires.
//   - appendfsync everysec: about the last two seconds of acknowledged scripts can be lost
//     when the machine crashes, and when the process dies while a slow disk made Redis delay
//     its writes to the file.
//   - appendfsync no, or no append-only file (snapshots only, or none): everything since the
//     last fsync or snapshot is lost on a restart.
//   - appendonly turned on at runtime (CONFIG SET) protects the data only once the rewrite it
//     starts has finished (INFO persistence: aof_rewrite_in_progress:0); the check reads the
//     setting, not the rewrite, so turn it on before the store's first use.
//   - no-appendfsync-on-rewrite yes skips the fsync while the file is rewritten, which makes
//     "always" lose what "no" loses during a rewrite; it must be no (the default).
//   - An allkeys-* maxmemory-policy evicts keys without a TTL when memory runs out: fences
//     included. noeviction (the default) or a volatile-* policy spares them.
//   - A failover to a replica (Sentinel, or REPLICAOF NO ONE by hand) keeps what replication
//     had delivered, whatever the fsync setting: replication is asynchronous, and a claim the
//     primary acknowledged but had not yet sent is gone, so the deposed owner's token is
//     admitted again (TestFailoverWithoutWaitLosesTheClaim shows it). So on a standalone
//     server the store waits for its replicas: every script that writes a fence (Claim,
//     Apply, Tx.Commit, Recover, SeeTopic, ResetTopic) is followed, in the same pipeline and
//     on the same connection, by a PUBLISH, WAIT for the replicas and INFO replication, and
//     the call answers only once all of them confirmed; if they do not within a second it
//     fails with [ErrNotDurable] (the write may be on the primary; it is not acknowledged, so
//     the consumer retries the batch and does not move on, and a claim is not taken as won).
//     The replicas waited for are the most that were ever connected at once, counted by
//     [Store.Check] and again after every write: a write after which more are connected than
//     it waited for (a replica attached since, or back from a disconnect) fails the same way
//     and is retried, waiting for them too. An acknowledged advance is then on every replica
//     that was connected when it was written, and survives the failover
//     (TestFailoverWithWaitKeepsTheClaim). The PUBLISH makes WAIT cover what the connection
//     did not write itself (a retry answered [fence.ErrDuplicate]); a user who may not
//     publish to the store's channel (the prefix followed by "replicated") is refused by the
//     check. The costs: a replication round trip per batch, and no acknowledgement while a
//     replica once counted is away or still in its initial synchronization (which confirms
//     nothing until it is done), the count never going down; after a failover the new
//     primary has one replica fewer until the old one rejoins as a replica, and fence writes
//     fail until then or until the process makes a new Store (a restart), which counts
//     afresh. After a failover the settings of the server the client reaches now (its
//     replication ID, read with every write, changed) are checked before a write there is
//     acknowledged. WAIT confirms that a replica received a write, not that it wrote it to its
//     disk: a replica that crashes before it is promoted keeps what its own fsync setting
//     keeps, so give replicas appendfsync always too. A replica that was away while a write
//     was made, never counted before, and is promoted before it caught up loses that write:
//     the server's min-replicas-to-write, set to the number of replicas, closes that window.
//   - On a Redis Cluster the store does not wait (a pipeline's WAIT is not routed to the node
//     of its script), so a cluster failover could lose acknowledged advances: [Store.Check]
//     refuses a cluster with a replica (CLUSTER NODES). A replica added later is not seen.
//
// Reads do not wait: Load, Recoveries, TopicHistory and SeeTopic finding the identity already
// stored may show a write that failed with [ErrNotDurable] and that a failover can still lose.
//
// A lost advance moves the fence back together with the data it guards (they are written in
// one script, so they stay consistent), but the owner's resume position moves back and a
// zombie whose token only a lost claim had outranked is accepted again until the current owner
// claims anew. So the store refuses, with [ErrNotDurable], a server whose settings (CONFIG GET
// appendonly, appendfsync, no-appendfsync-on-rewrite, maxmemory-policy, read by [Store.Check]
// or the first call) can lose an acknowledged write, and one whose settings it cannot read
// (CONFIG renamed away or not permitted), and a cluster with replicas, and waits for a
// standalone server's replicas, unless
// [AllowLosingAcknowledgedWrites] names the risk. Refusing rather than warning: a warning in a
// log does not stop a zombie write, and the option keeps the choice with the user.
//
// # Not covered
//
//   - An outbox. A side effect appended with [Tx.XAdd] to a stream in the fenced transaction is
//     refused with a zombie's batch, but nothing here relays the stream to Kafka (ordering,
//     marks, retries, signatures: package outbox's relay needs an outbox store, which Redis
//     does not have yet). Until then, effects that must leave exactly once go through an
//     outbox in PostgreSQL or SQLite, in a transaction of their own.
//   - Reads inside the transaction: a Tx only writes. A handler reads with the client before
//     it queues; a batch's own reads are not isolated from other writers of the same keys, so
//     keys are best written by their partition's owner only (as the fence intends).
//   - A Redis Cluster of several nodes: the tests run one of a single node holding every slot
//     (the cluster's key rules apply, resharding and failover do not happen).
//
// # Why go-redis
//
// github.com/redis/go-redis/v9 is the Redis project's own Go client: maintained with the
// server, one API for standalone, Sentinel failover and Cluster (it routes a script by its
// first key), EVALSHA with EVAL fallback (redis.Script), and few dependencies. The store takes
// redis.Cmdable, so every client option (TLS, ACL user, timeouts, pools) stays the caller's.
package redisfence
