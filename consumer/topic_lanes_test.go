package consumer_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
)

// poisonLanes is a handler with a first stage: Prepare refuses a record whose value is
// "poison" for good; Handle and DeadLetter count what they are given.
type poisonLanes struct {
	applied, deadLettered *atomic.Int64
}

func (h poisonLanes) Prepare(_ context.Context, r *kgo.Record) (any, error) {
	if string(r.Value) == "poison" {
		return nil, consumer.Permanent(errPoison)
	}
	return nil, nil
}

func (h poisonLanes) Handle(_ context.Context, _ *memfence.Tx, b *consumer.Batch) error {
	h.applied.Add(int64(len(b.Records)))
	return nil
}

func (h poisonLanes) DeadLetter(context.Context, *memfence.Tx, *consumer.Batch, *kgo.Record) error {
	h.deadLettered.Add(1)
	return nil
}

type poisonError struct{}

func (poisonError) Error() string { return "poison" }

var errPoison = poisonError{}

// A poison record of the lanes is held with a grown topic: with a prepare stage (lanes), a poison
// record at the head of the prepared prefix goes to deadLetter directly (applyPrefix ->
// deadLetter), not through process, so deadLetter makes the comparison process makes first
// when the member's topic look saw the topic grow. Without it a record produced to an older
// partition after the growth (a key that moved there, whose earlier records may wait on
// another partition) would be dead-lettered, a fenced write advancing the partition's
// position, while every partition must be held until the growth is acknowledged. The first refusal after the growth (partition
// 1's at a batch after a look, or the new partition's claim, assigned after the look's
// metadata refresh) proves a look marked every worker; the poison record on partition 0 must
// then be held too, and dead-lettered only after the acknowledgement. (Mutant
// LanesDeadLetterPastHold: dead-lettered while held.)
func TestLanesPoisonHeldAfterGrowth(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(2, "src"))
	store := newStore(t)
	ctx := context.Background()
	var applied, dead atomic.Int64
	m := newMeter()
	pl := poisonLanes{applied: &applied, deadLettered: &dead}
	c, err := consumer.New("g", []string{"src"}, store, pl.Handle,
		consumer.Lanes(1, func(ctx context.Context, _ fence.Key, _ fence.Token, r *kgo.Record) (any, error) {
			return pl.Prepare(ctx, r)
		}),
		consumer.FencedDeadLetters(pl.DeadLetter),
		consumer.Kafka(fastKafka(brokers)...), consumer.Logger(quiet), consumer.MeterProvider(m),
		consumer.RetryBackoff(10*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	send := func(p int32, v string) {
		t.Helper()
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "src", Partition: p, Key: []byte("k"), Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	send(0, "1")
	send(1, "1")
	waitFor(t, "both partitions applied", 30*time.Second, func() bool { return applied.Load() == 2 })
	h, err := store.TopicHistory(ctx, "g", "src")
	if err != nil || len(h) != 1 {
		t.Fatalf("stored identities %+v, %v", h, err)
	}
	before := h[0].Identity

	if r, err := kadm.NewClient(cl).CreatePartitions(ctx, 1, "src"); err != nil || r.Error() != nil {
		t.Fatalf("growing the topic: %v %v", err, r.Error())
	}
	// Partition 1 compares again at its next batch once a look marked it, and holds: records
	// are produced until a partition holds (every look marks every worker of the topic at once).
	deadline := time.Now().Add(30 * time.Second)
	for m.sum(t, "baton.consumer.topic_refusals") < 1 {
		if time.Now().After(deadline) {
			t.Fatal("no partition held after the growth")
		}
		send(1, "2")
		time.Sleep(500 * time.Millisecond)
	}
	held := m.sum(t, "baton.consumer.topic_refusals")
	send(0, "poison")
	waitFor(t, "the poison record dead-lettered or partition 0 held", 30*time.Second, func() bool {
		return dead.Load() > 0 || m.sum(t, "baton.consumer.topic_refusals") > held
	})
	if n := dead.Load(); n > 0 {
		t.Fatalf("a poison record produced after the growth was dead-lettered while the topic was held (%d); refusals %d", n, m.sum(t, "baton.consumer.topic_refusals"))
	}
	after := before
	after.Partitions = 3
	if err := store.ResetTopic(ctx, "g", "src", before, after, "test: growth acknowledged"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the poison record dead-lettered after the acknowledgement", 30*time.Second, func() bool { return dead.Load() == 1 })
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
}
