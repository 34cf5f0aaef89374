// Command lock-to-partition is a migration guide from a distributed lock to a Baton consumer,
// in three steps: (1) keep the lock but fence the writes with its token, (2) move the work onto
// a keyed topic and a Baton consumer, (3) retire the lock. It runs one job, deposits into an
// account balance (a read-modify-write), under one fault in each version: the worker is paused
// between deciding to write and writing, past its lease (or session), another worker takes
// over, and the paused one resumes. It prints what each version does to the paused holder:
//
//   - (a) before: a Redis lease lock (SET NX PX) the worker takes and checks: the paused
//     worker's write lands and an update is lost. Step 1 is impossible with Redis: it hands out
//     no fencing token.
//
//   - (1) step 1: the etcd lock (fence/lease/etcdlease), writes fenced with its token through
//     fence/lease: the paused worker's write is refused and its job runs again.
//
//   - (2) step 2: a consumer over a keyed Kafka topic, the partition as the lock: the paused
//     member's write is refused and the new owner re-reads the unapplied record.
//
//     go run ./examples/lock-to-partition
//
// (a) uses the Redis at BATON_REDIS_ADDR, or an in-process stand-in if it is not set; step 1
// uses the etcd at BATON_ETCD_ENDPOINTS and is skipped if it is not set. README.md is the guide.
package main
