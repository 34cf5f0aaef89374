package consumer

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/memfence"
	"github.com/batonhq/baton/partition"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Review finding "ReviveRacesRevoke" (fixed: run.stopPartitions marks the worker stopping): OnPartitionsRevoked (or Lost) picks the partition's
// worker the watchdog stopped, and the watchdog's revive waits for the same worker; when it
// returns, both race for run.mu. If revive wins, it registers a new worker for the partition
// and marks the old one removed, so the revoke's stop of the old one returns at once: the
// rebalance barrier passes with a live worker on a revoked partition. The test lines the two
// up on one stopped worker many times and requires the partition to have no worker once
// the revoke returned.
func TestWatchdogReviveDoesNotOutliveARevoke(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	store, err := memfence.New()
	if err != nil {
		t.Fatal(err)
	}
	factory := func(context.Context, fence.Key, fence.Token) (Handler[*memfence.Tx], error) {
		return HandlerFunc[*memfence.Tx](func(context.Context, *memfence.Tx, *Batch) error { return nil }), nil
	}
	c, err := New("g", []string{"orders"}, fence.Sink[*memfence.Tx](store), factory,
		Kafka(kgo.SeedBrokers(cluster.ListenAddrs()...)), Logger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	id := partition.ID{Topic: "orders", Partition: 0}
	for i := 0; i < 40; i++ {
		r := &run[*memfence.Tx]{c: c, workers: map[partition.ID]*worker[*memfence.Tx]{}, space: make(chan struct{}, 1), fatal: make(chan error, 1)}
		r.ctx, r.cancel = context.WithCancel(context.Background())
		r.clp.Store(cl)
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
