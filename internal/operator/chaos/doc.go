// Package chaos proves Baton's claims by breaking things: it runs worker processes of a Baton
// application against a real Kafka broker and a real database, produces a keyed stream whose
// fold is known in advance, injects faults (frozen workers past their session timeout,
// crashes, graceful handovers, rebalance storms, broker and database restarts, group
// deletion; and the coordinator and static-membership faults: a paused member resumed while the group coordinator loads after a
// broker restart or after its broker was killed in a three-broker cluster, a static member
// replaced without a rebalance, a receiver of two destination topics with one inbox; and the
// topic faults, fenced runs only: the source topic deleted and recreated, or grown, mid-run,
// with the harness as the operator who drains, proves the hold and runs baton topics reset or
// ack; and the network faults, with each worker in a network namespace of its own: its link to
// the brokers or to the database cut, or made flaky, with tc (netns.go, faults_net.go), or, in
// the three-broker cluster, the group coordinator's broker cut from the other brokers and from
// every member but one writer, a minority coordinator, with iptables on the loopback and tc
// (faults_minority.go)), and then checks what landed:
//
//   - no stale write: no committed batch carries a token lower than one committed before it on
//     its partition, no batch re-applies offsets already applied, no two workers commit under
//     one token, and no frozen-and-resumed worker commits after its takeover (offsets are
//     compared within a topic's incarnation: a recreated topic's start again at 0);
//   - nothing applied from a recreated or grown topic before the operator released it;
//   - no lost update and no double apply: every key's final state equals the fold of its
//     records, in order;
//   - the faults bit: every frozen worker's held write was attempted after its takeover and is
//     counted by outcome (refused as stale under Baton, committed under the baselines);
//   - liveness: after the last fault, everything produced is applied within a stated bound.
//
// Faults run one after another, or, with Config.Overlap above 1, several at once on disjoint
// targets (schedule.go): each kind declares what it holds while it runs (a worker, a broker
// node, the database, or everything), the faults are drawn up front from the seed as a schedule
// the progress prints and Config.ScheduleFile keeps (JSON lines), and Config.Replay runs a
// schedule again. Each fault still counts only once proven; one that cannot be proven beside
// the others in flight is reported unproven.
//
// The same workload runs in three modes: Fenced (Baton), Unfenced (Kafka's assignment alone)
// and Lock (a naive Redis lease), so the checker is shown to fail what it should fail.
//
// With Config.Audit the online auditor ('baton audit', internal/operator/audit) runs beside the
// workers as an operator runs it, a pass every interval on each group, reading only what Baton
// records and what Kafka holds; its violations fail the run ([AuditVerdict]). A baseline records
// no fences, so there it sees only Kafka's side: offsets committed on partitions no fence claims.
//
// With Config.ShardURLs the built-in workload's fenced workers write through a sharded sink
// (fence/shard) over several PostgreSQL databases, home first: each batch commits in its
// partition's shard, the run's logs stay in the run's database, and the checker judges the
// shards' states and applied logs, copied out whole after the run (sharded.go). Its fault,
// shard-outage, stops one non-home shard's database for a while and restarts it: proven by a
// refused connection, records of the shard's partitions pending and then applied; measured by
// what the other shards' partitions applied during the outage ([ShardOutage]).
//
// The built-in workload writes through a deliberately naive read-modify-write (read a key's
// state, compute, write it back): the access pattern that locks are usually asked to protect.
//
// An application brings its own workload as an [App] (Config.App): the topics to create, the
// consumers every worker process runs (a handler factory per partition and token, with the
// fenced outbox and optionally the inbox), the input to produce, when it has settled, and its
// invariants over the databases. It runs under the same faults, in Fenced or Unfenced mode,
// and gets the same verdict table (its invariants added to the harness's) and timeline. The
// built-in workload is one App; examples/saga is another.
//
// Reports: [WriteVerdict] writes the verdict table; [WriteReport] writes a directory a person
// can read at any run size (index.html with the verdict and a summary drawing of faults,
// refused writes, progress, backlog and apply lag per time step, a timeline file per 16
// partitions, the fault list); [WriteTimeline] draws the whole run as one SVG, which suits a short run.
package chaos
