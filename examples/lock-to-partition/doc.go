// Command lock-to-partition runs one job twice under one fault: deposits into an account
// balance, a read-modify-write. (a) is written the usual way, with a Redis lease lock per
// account that the worker takes and checks before it writes; (b) is written with Baton, where
// the Kafka partition is the lock and the database checks the token. In both, the worker is
// paused between deciding to write and writing, past its lease (or session), another worker
// takes over, and the paused one resumes. The lock version loses an update; Baton refuses the
// zombie's write.
//
//	go run ./examples/lock-to-partition
//
// (a) uses the Redis at BATON_REDIS_ADDR, or an in-process stand-in if it is not set.
package main
