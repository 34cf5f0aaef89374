package consumer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
)

// hookClock remembers when an after-commit hook last ran, per partition.
type hookClock struct {
	mu   sync.Mutex
	last map[int32]time.Time
}

func (h *hookClock) hook(_ context.Context, k fence.Key, _ fence.Token) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.last[k.Partition] = time.Now()
	return nil
}

// ranSince reports whether the hook of every partition in ps ran after t.
func (h *hookClock) ranSince(t time.Time, ps ...int32) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, p := range ps {
		if !h.last[p].After(t) {
			return false
		}
	}
	return true
}

// An idle partition (no record ever arrives: a standalone relay's shard, whose coordination
// topic receives nothing) runs its after-commit hook (the relay) until the member sees the
// topic grow; then every partition, old and new, is held, the hook included, until the growth
// is acknowledged. Were only a batch to make a worker compare the topic again, the older
// partitions' relays would go on past the growth, and entities moved between shards would be
// relayed by two shards at once. (Mutant IdleTopicChangeUnchecked: partitions 0 and 1 are
// never held: fewer than 2 refusals are ever counted.)
func TestIdleGrownTopicHoldsAfterCommit(t *testing.T) {
	brokers, store, clock, m, mb := startIdleCoord(t)
	ctx := context.Background()
	h, err := store.TopicHistory(ctx, "g", "coord")
	if err != nil || len(h) != 1 || h[0].Identity.Partitions != 2 {
		t.Fatalf("stored identities %+v, %v: want 2 partitions adopted by the claims", h, err)
	}
	before := h[0].Identity

	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if r, err := kadm.NewClient(cl).CreatePartitions(ctx, 1, "coord"); err != nil || r.Error() != nil {
		t.Fatalf("growing the topic: %v %v", err, r.Error())
	}
	// The member looks at its topics every 5 s (topicLook): the bound leaves room for several
	// looks. Partitions 0 and 1 are held (kfake may assign the new partition 2 only later; if
	// it does, it is held at its claim, a third refusal).
	waitFor(t, "partitions 0 and 1 held (2 refusals)", 20*time.Second, func() bool { return m.sum(t, "baton.consumer.topic_refusals") >= 2 })
	held := time.Now()
	time.Sleep(300 * time.Millisecond) // fifteen idle intervals
	if clock.ranSince(held, 0) || clock.ranSince(held, 1) || clock.ranSince(time.Time{}, 2) {
		t.Fatal("an after-commit hook ran while the grown topic was held")
	}

	after := before
	after.Partitions = 3
	if err := store.ResetTopic(ctx, "g", "coord", before, after, "test: growth acknowledged"); err != nil {
		t.Fatal(err)
	}
	acked := time.Now()
	waitFor(t, "the hooks running again after the acknowledgement", 30*time.Second, func() bool { return clock.ranSince(acked, 0, 1) })
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
}

// startIdleCoord starts one member of group "g" on a kfake topic "coord" of 2 partitions whose
// handler does nothing and whose after-commit hook records when each partition's hook ran, and
// waits until both hooks run: an idle relay's shards, as the growth tests need them. The client
// keeps franz-go's default MetadataMaxAge; opts are added to its client's.
func startIdleCoord(t *testing.T, opts ...kgo.Opt) ([]string, *memfence.Store, *hookClock, *meter, *member) {
	t.Helper()
	brokers := fakeKafka(t, kfake.SeedTopics(2, "coord"))
	store := newStore(t)
	clock := &hookClock{last: map[int32]time.Time{}}
	noop := consumer.Handler[*memfence.Tx](func(context.Context, *memfence.Tx, *consumer.Batch) error { return nil })
	m := newMeter()
	c, err := consumer.New("g", []string{"coord"}, store,
		nil, consumer.PerPartition(func(context.Context, fence.Key, fence.Token) (consumer.Handler[*memfence.Tx], error) {
			return noop, nil
		}),
		consumer.Kafka(append(fastKafka(brokers), opts...)...), consumer.Logger(quiet), consumer.MeterProvider(m),
		consumer.RetryBackoff(10*time.Millisecond, 200*time.Millisecond),
		consumer.AfterCommit(clock.hook, 20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	waitFor(t, "both partitions' hooks running", 30*time.Second, func() bool { return clock.ranSince(time.Time{}, 0, 1) })
	return brokers, store, clock, m, mb
}
