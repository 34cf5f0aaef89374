package consumer_test

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
	"github.com/batonhq/baton/partition"
)

// refuseFirst is the classic epoch source, except that its first n proofs say "not current":
// the coordinator's answer to a member whose group moved on while its join was in flight.
// With hold set, a refused proof first waits for hold to return (as long as ctx lives).
type refuseFirst struct {
	consumer.EpochSource
	left    atomic.Int32
	refused atomic.Int32
	hold    func(ctx context.Context, cl *kgo.Client)
}

func (s *refuseFirst) VerifyCurrent(ctx context.Context, cl *kgo.Client, p partition.ID, epoch int64) (int64, bool, error) {
	if s.left.Add(-1) >= 0 {
		if s.hold != nil {
			s.hold(ctx, cl)
		}
		s.refused.Add(1)
		return 0, false, nil
	}
	return s.EpochSource.VerifyCurrent(ctx, cl, p, epoch)
}

// joinOther starts a member of group consuming topic (not the consumer's), whose join starts a
// new group session in which the consumer keeps its partitions; the returned function stops it.
func joinOther(t *testing.T, brokers []string, group, topic string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	b, err := kgo.NewClient(append(fastKafka(brokers), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.Balancers(kgo.CooperativeStickyBalancer()))...)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			b.PollFetches(ctx)
		}
	}()
	return func() { cancel(); wg.Wait(); b.Close() }
}

// The chaos fault topic-grow found it (two partitions never applied after the growth was
// acknowledged): the coordinator refuses a member the partition (the group moved on while the
// member's join was in flight), the worker gives up, and the next group session gives the
// partition back to the member without franz-go revoking it first (a cooperative rebalance
// keeps what a member says it owns). Nothing ever restarted the worker: the partition stayed
// unprocessed for as long as the member lived. Here the first proof is refused; the partition
// must stay unprocessed (the refusal is real: nothing is applied before the next session), and
// the session that another member's join starts (it consumes another topic, so orders/0 stays
// with A) must restart it and apply everything. Fails under RefusedPartitionNotRetried.
func TestRefusedPartitionRetriedInANewSession(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders", "other"))
	const keys, n = 4, 20
	produceSeq(t, brokers, "orders", keys, 1, n)
	store := newStore(t)
	f := newFolder()
	epochs := &refuseFirst{EpochSource: consumer.ClassicGeneration()}
	epochs.left.Store(1)
	var gaveUp, retried, early atomic.Bool
	log := slog.New(logSpy{Handler: logSpy{Handler: logSpy{Handler: quiet.Handler(), want: "no longer owns the partition: left unprocessed", seen: &gaveUp},
		want: "still assigned to this member in a later group session", seen: &retried},
		want: "a group session began since the coordinator refused", seen: &early})
	a, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](store), nil, consumer.PerPartition(f.factory),
		consumer.Kafka(fastKafka(brokers)...), consumer.Logger(log), consumer.Epochs(epochs))
	if err != nil {
		t.Fatal(err)
	}
	ma := start(t, a)
	waitFor(t, "A's first proof refused and the partition given up", 20*time.Second, gaveUp.Load)
	// The fault happened and holds: within a while of the refusal nothing is applied (the
	// member's group session has not changed, so nothing restarts the worker yet).
	time.Sleep(time.Second)
	for k := 0; k < keys; k++ {
		if _, ok := store.Get("k/k" + strconv.Itoa(k)); ok || retried.Load() || early.Load() {
			t.Fatalf("before any new session: key k%d applied %v, retried %v/%v; want none (the refusal must stop the partition)", k, ok, retried.Load(), early.Load())
		}
	}

	// Another member joins the group for another topic: a new session, orders/0 kept by A.
	defer joinOther(t, brokers, "g", "other")()

	waitFor(t, "A applies everything after the new session", 15*time.Second, allApplied(store, keys, n))
	if !retried.Load() {
		t.Error("applied without retryRefused's INFO line")
	}
	if err := ma.stop(); err != nil {
		t.Fatalf("A: %v", err)
	}
	checkFold(t, store, keys, n)
	if v := f.Violations(); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
	if got := epochs.refused.Load(); got != 1 {
		t.Errorf("%d proofs refused, want 1", got)
	}
}

// The same refusal, decided while the new session begins: the proof starts in one session,
// another member joins meanwhile, and the refusal is returned only after A's next
// OnPartitionsAssigned began (it finds no worker to restart: this one has not given up yet).
// The worker must notice that a session began since its proof and decide again at once;
// waiting for the next session would leave the partition unprocessed for good, since no other
// member joins. Fails under RefusedDuringSessionMissed.
func TestRefusedDuringANewSessionRetried(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders", "other"))
	const keys, n = 4, 20
	produceSeq(t, brokers, "orders", keys, 1, n)
	store := newStore(t)
	f := newFolder()
	var moved atomic.Bool
	started := make(chan struct{})
	var a *consumer.Consumer[*memfence.Tx]
	epochs := &refuseFirst{EpochSource: consumer.ClassicGeneration()}
	epochs.left.Store(1)
	epochs.hold = func(ctx context.Context, _ *kgo.Client) {
		from := consumer.Sessions(a)
		close(started)
		for ctx.Err() == nil && !moved.Load() {
			moved.Store(consumer.Sessions(a) > from)
			time.Sleep(20 * time.Millisecond)
		}
	}
	var retried atomic.Bool
	log := slog.New(logSpy{Handler: quiet.Handler(), want: "a group session began since the coordinator refused", seen: &retried})
	a, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](store), nil, consumer.PerPartition(f.factory),
		consumer.Kafka(fastKafka(brokers)...), consumer.Logger(log), consumer.Epochs(epochs),
		consumer.ClaimWait(200*time.Millisecond)) // the assignment callback must not wait for the held proof
	if err != nil {
		t.Fatal(err)
	}
	ma := start(t, a)
	select {
	case <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("timed out waiting for A's first proof")
	}
	defer joinOther(t, brokers, "g", "other")()
	waitFor(t, "A's next session begins during the refused proof", 20*time.Second, moved.Load)
	waitFor(t, "A applies everything", 15*time.Second, allApplied(store, keys, n))
	if err := ma.stop(); err != nil {
		t.Fatalf("A: %v", err)
	}
	checkFold(t, store, keys, n)
	if v := f.Violations(); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
	if !retried.Load() || epochs.refused.Load() != 1 {
		t.Errorf("retried %v, %d proofs refused; want a retry after 1", retried.Load(), epochs.refused.Load())
	}
}
