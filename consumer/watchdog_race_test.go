package consumer

import (
	"testing"
	"time"

	"github.com/batonhq/baton/partition"
)

// A revive racing a revoke (run.stopPartitions marks the worker stopping): OnPartitionsRevoked
// (or Lost) picks the partition's worker the watchdog stopped, and the watchdog's revive waits for the same worker; when it
// returns, both race for run.mu. If revive wins, it registers a new worker for the partition
// and marks the old one removed, so the revoke's stop of the old one returns at once: the
// rebalance barrier passes with a live worker on a revoked partition. The test lines the two
// up on one stopped worker many times and requires the partition to have no worker once
// the revoke returned.
func TestWatchdogReviveDoesNotOutliveARevoke(t *testing.T) {
	id := partition.ID{Topic: "orders", Partition: 0}
	for i := 0; i < 40; i++ {
		r := testRun(t)
		old := newWorker(r, id, 1)
		old.expired = true // stopped by the watchdog; its goroutine is still returning
		r.workers[id] = old

		revoked := make(chan struct{})
		go func() { r.stopPartitions(map[string][]int32{"orders": {0}}, "revoked"); close(revoked) }()
		revived := make(chan struct{})
		go func() { r.revive(); close(revived) }()
		deadline := time.Now().Add(10 * time.Second)
		for old.ctx.Err() == nil { // the revoke is in stop(old), waiting for it
			if time.Now().After(deadline) {
				t.Fatal("the revoke never reached the worker")
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(5 * time.Millisecond) // let revive reach the same wait
		r.mu.Lock()
		close(old.done) // the old worker returns: both race for run.mu
		r.mu.Unlock()
		for _, ch := range []chan struct{}{revoked, revived} {
			select {
			case <-ch:
			case <-time.After(10 * time.Second):
				t.Fatal("revoke or revive did not return")
			}
		}
		r.mu.Lock()
		w := r.workers[id]
		r.mu.Unlock()
		r.cancel()
		r.wg.Wait()
		if w != nil {
			t.Fatalf("iteration %d: a worker (revived=%v) runs the partition after its revoke returned", i, w.revived)
		}
	}
}
