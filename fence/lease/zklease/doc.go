// Package zklease is a ZooKeeper token source for fence/lease: the lock recipe with ephemeral
// sequential nodes, with the node's czxid as the fencing token.
//
// # How it works
//
// Each Acquire opens its own session (a lease is a session, so independent resources fail
// independently), creates a protected ephemeral sequential node under
// Root + "/" + url.PathEscape(resource) (zk's CreateProtectedEphemeralSequential, so a create
// whose answer was lost to a disconnection is found again rather than duplicated), and holds
// the lease once its node has the lowest sequence number, waiting by watching only its
// predecessor. The token is {Era, the node's czxid}. The lease's context ends when the session
// expires, when the client has been disconnected for the session timeout (the session may have
// expired on the server; the source then closes it, so a reconnect cannot revive the node), or
// when the node is deleted. Release closes the session, which deletes the node.
//
// # Why czxid and not the sequence number
//
// Both grow with each successive holder of one resource. But the sequence number is a counter
// of the parent node (its cversion): if the parent is deleted and recreated (a cleanup job, a
// container node removed when empty) the sequence starts again at 0000000000, and the sink,
// which remembers the highest token, would refuse the rightful holder from then on. The czxid
// is the zxid of the transaction that created the node: unique and increasing across the whole
// ensemble, whatever the path, and it survives the recreation of any node. It is also 64 bits
// (the sequence number is 32).
//
// # What the token survives
//
//   - Restart of a server or the whole ensemble: zxids are on disk (transaction log and
//     snapshots) and continue (TestRestart: the token after a restart is above the one before).
//     ZooKeeper also keeps sessions across a restart, which is why a holder that gave up closes
//     its session instead of reconnecting.
//   - Leader failover: a new leader starts a new epoch, the high 32 bits of every zxid, so
//     zxids jump upward.
//   - Recreation of the lock's parent node: yes (see above).
//   - Loss of the ensemble's data, or a restore from an old snapshot: NOT survived. zxids start
//     again (or go back) and the sink refuses the new holders as stale until an operator
//     recovers the keys with fence.Sink.Recover and raises [Era].
//
// # Client
//
// github.com/go-zookeeper/zk (v1.0.4): the community-maintained continuation of
// samuel/go-zookeeper (archived), pure Go (no cgo, no libzookeeper), with the 3.5+ operations
// (protected ephemeral sequential creates, container and TTL nodes, multi). Its calls take no
// context, so Acquire closes its own session when ctx ends, which fails any call in flight. An
// unreachable ensemble fails Acquire when ctx ends, with the client's last connection error.
//
// # Latency
//
// BenchmarkAcquireRelease (uncontended Acquire + Release: new session, create parents, create
// node, list, stat, close session) against the local ZooKeeper 3.9.5 from
// deploy/local/zookeeper.sh on the 2-core development machine: 12.7 ms/op (200 iterations);
// most of it is the session set-up and close.
package zklease
