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
		r.dispatch(r.ctx, id, batch(500), [16]byte{}, 0, -1, 0)
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
		r.dispatch(r.ctx, id, batch(510), [16]byte{}, 0, -1, 0)
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

// A poll's records that reach a restarted worker after its claim resolved: the interleaving
// the drop above cannot see. The poller's PollFetches returns records of the predecessor's
// cursor (offsets 500..), fetched before the restart; the poll goroutine is then not scheduled
// while the watchdog restarts the worker and its claim resolves and seeks back to the first
// record its predecessor was handed (300); then the poller dispatches the stale batch. Handed
// to the worker, the batch would be applied (the fence accepts first > stored: logs have gaps)
// and 300..499 skipped. The first batch after a seek, from a poll begun before it, must start
// where the seek (or the log start) says, or it is dropped and the seek done again; a poll
// begun after the seek is trusted, whatever gap the log has. (Mutant StalePollAfterSeekTaken.)
func TestFirstBatchAfterASeekWithAnUnexplainedGapIsDropped(t *testing.T) {
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
	claimed := func() (*worker[*memfence.Tx], int64) { // a restarted worker whose claim seeks to 300; the stamp of a poll begun before
		w := newWorker(r, id, 1)
		w.revived, w.late, w.from = true, true, 300
		r.mu.Lock()
		r.workers[id] = w
		r.mu.Unlock()
		stamp := r.seeks.Load()
		r.claimResolved(w, true)
		return w, stamp
	}
	drop := func(w *worker[*memfence.Tx]) {
		r.mu.Lock()
		w.removed = true
		delete(r.workers, id)
		r.mu.Unlock()
		r.total.Add(-w.inflight.Swap(0))
	}
	handed := func(w *worker[*memfence.Tx]) int64 {
		select {
		case recs := <-w.in:
			return recs[0].Offset
		default:
			return -1
		}
	}

	w, before := claimed()
	r.dispatch(r.ctx, id, batch(500), [16]byte{}, 0, -1, before)
	if got := handed(w); got >= 0 {
		t.Fatalf("a batch starting at %d, from a poll begun before the seek to 300, was handed to the restarted worker: 300..499 would be skipped", got)
	}
	if w.seekedAt <= before || !w.checkSeek {
		t.Fatalf("the stale batch was dropped without seeking again (seeked at %d, poll %d)", w.seekedAt, before)
	}
	r.dispatch(r.ctx, id, batch(300), [16]byte{}, 0, -1, r.seeks.Load()) // the next poll, after the seek
	if got := handed(w); got != 300 {
		t.Fatalf("after the seek again: handed %d, want the batch at 300", got)
	}
	drop(w)

	// A batch of an earlier poll that starts where the seek says is the seek's own.
	w, before = claimed()
	r.dispatch(r.ctx, id, batch(300), [16]byte{}, 0, -1, before)
	if got := handed(w); got != 300 {
		t.Fatalf("a batch at the seek's offset: handed %d, want 300", got)
	}
	drop(w)

	// The log start explains a gap: the log starts at 400, past the seek.
	w, before = claimed()
	r.dispatch(r.ctx, id, batch(400), [16]byte{}, 400, -1, before)
	if got := handed(w); got != 400 {
		t.Fatalf("a batch at the log start 400, past the seek to 300: handed %d, want 400", got)
	}
	drop(w)

	// A poll begun after the seek is trusted: its gap is the log's (a transaction marker at 300).
	w, _ = claimed()
	r.dispatch(r.ctx, id, batch(301), [16]byte{}, 0, -1, r.seeks.Load())
	if got := handed(w); got != 301 {
		t.Fatalf("a batch of a poll begun after the seek, at 301: handed %d, want 301", got)
	}
	drop(w)
}
