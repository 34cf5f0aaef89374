// Package redislock is the naive distributed lock from the seeds, kept only as the chaos
// harness's baseline: SET key value NX PX ttl to acquire, a compare-and-delete script to release,
// a compare-and-extend script to renew. It is a lease: a holder paused past the TTL still believes
// it holds the lock, which is exactly the failure the harness demonstrates. Do not use it to
// protect data; that is what Baton's fence is for.
//
// It speaks just enough RESP over one TCP connection to do that, so the baseline needs no
// third-party Redis client.
package redislock
