package consumer

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
	"github.com/batonhq/baton/partition"
)

// A restarted worker drops stale records: records a poll returned before a worker was
// restarted (retryRefused, the watchdog's revive) reach the poller's dispatch only after the
// new worker is registered. They come from the predecessor's cursor, past records it dropped
// unapplied; handed to the new worker, they would be applied right after its claim, ahead of
// the seek to the sink's position, and the records in between skipped (the fence accepts a
// batch that starts past position + 1: logs have gaps). A restarted worker's partition is
// paused until its claim resolved, so whatever reaches it before then is such a batch:
// dispatch drops it, noting its first offset for the seek when the worker has none yet.
// RevivedTakesStaleFetch fails it.
func TestRevivedWorkerDropsRecordsFetchedBeforeItsClaim(t *testing.T) {
	r := testRun(t)
	defer r.cancel()
	id := partition.ID{Topic: "orders", Partition: 0}
	batch := func(from int64) []*kgo.Record {
		var recs []*kgo.Record
		for o := from; o < from+10; o++ {
			recs = append(recs, &kgo.Record{Topic: "orders", Offset: o})
		}
		return recs
	}
	for _, pred := range []int64{-1, 300} { // the predecessor's first dispatched offset (none yet, or 300)
		w := newWorker(r, id, 1)
		w.revived, w.late, w.from = true, true, pred
		r.workers[id] = w
		r.dispatch(r.ctx, id, batch(500), [16]byte{}, 0)
		want := pred
		if pred < 0 {
			want = 500
		}
		if n, in := len(w.in), w.inflight.Load(); n != 0 || in != 0 || r.total.Load() != 0 || w.from != want {
			t.Fatalf("predecessor from %d: a restarted worker not yet claimed was handed %d batches (%d records in flight, %d in the run), from %d; want none and from %d",
				pred, n, in, r.total.Load(), w.from, want)
		}
		// Once its claim resolved (and its seek done), records reach it as usual.
		r.mu.Lock()
		w.claimDone = true
		r.mu.Unlock()
		r.dispatch(r.ctx, id, batch(510), [16]byte{}, 0)
		if n := len(w.in); n != 1 {
			t.Fatalf("after the claim: %d batches handed, want 1", n)
		}
		r.mu.Lock()
		w.removed = true
		delete(r.workers, id)
		r.mu.Unlock()
		r.total.Add(-w.inflight.Swap(0))
	}
}

// testRun returns a run of a consumer of "orders" on a kfake cluster, with a client that is
// not in the group: for the registry's unit tests, which start no Run.
func testRun(t *testing.T) *run[*memfence.Tx] {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	store, err := memfence.New()
	if err != nil {
		t.Fatal(err)
	}
	factory := func(context.Context, fence.Key, fence.Token) (Handler[*memfence.Tx], error) {
		return Handler[*memfence.Tx](func(context.Context, *memfence.Tx, *Batch) error { return nil }), nil
	}
	c, err := New("g", []string{"orders"}, fence.Sink[*memfence.Tx](store), nil, PerPartition(factory),
		Kafka(kgo.SeedBrokers(cluster.ListenAddrs()...)), Logger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	r := &run[*memfence.Tx]{c: c, workers: map[partition.ID]*worker[*memfence.Tx]{}, space: make(chan struct{}, 1), fatal: make(chan error, 1)}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.clp.Store(cl)
	return r
}
