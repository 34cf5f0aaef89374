package consumer

import "time"

// DeadLetterHeaders exposes deadLetterHeaders to the external tests (the fuzzer).
var DeadLetterHeaders = deadLetterHeaders

// SkewWatchdog moves the clock the watchdog of c's running Run judges the session by, by d,
// until the watchdog fires (0 restores it). It does nothing when c is not running.
func SkewWatchdog[Tx any](c *Consumer[Tx], d time.Duration) {
	if r := c.cur.Load(); r != nil {
		r.wd.skew.Store(int64(d))
	}
}

// MaxDeadLetterReason exposes the bound of the baton.dlq.reason header.
const MaxDeadLetterReason = maxDeadLetterReason

// Sessions returns how many group sessions (OnPartitionsAssigned calls) the running Run of c
// has seen; 0 when none runs.
func Sessions[Tx any](c *Consumer[Tx]) int64 {
	if r := c.cur.Load(); r != nil {
		return r.sessions.Load()
	}
	return 0
}
