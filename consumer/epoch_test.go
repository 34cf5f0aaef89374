package consumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/partition"
)

// A late "renewal" from a member's old generation is refused: Kafka ties a member's liveness to
// its member id and generation, so the classic proof at the old generation fails once the group
// moved on, and a write under the old token is refused by the fence.
func TestClassicGenerationRefusesALateRenewal(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	ctx := testenv.Context(t, 90*time.Second)
	topic := testenv.NewTopic(t, brokers, 2)
	group := testenv.UniqueName("g")
	gens := make(chan int32, 16)
	member := func() *kgo.Client {
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
			kgo.FetchMaxWait(100*time.Millisecond),
			kgo.OnPartitionsAssigned(func(_ context.Context, cl *kgo.Client, _ map[string][]int32) {
				_, g := cl.GroupMetadata()
				gens <- g
			}))
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	a := member()
	defer a.Close()
	var old int32
	for old == 0 {
		pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		a.PollFetches(pctx)
		cancel()
		select {
		case old = <-gens:
		default:
		}
		if ctx.Err() != nil {
			t.Fatal("A was never assigned")
		}
	}
	src := consumer.ClassicGeneration()
	p0 := partition.ID{Topic: topic, Partition: 0}
	var owned int64
	var ok bool
	var err error
	for { // the group may still be settling: "cannot tell" is retried, never proof
		if owned, ok, err = src.VerifyCurrent(ctx, a, p0, int64(old)); err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || !ok || owned != int64(old) {
		t.Fatalf("A at its own generation %d: owned=%d ok=%v err=%v", old, owned, ok, err)
	}
	b := member() // B joins: the generation moves on
	defer b.Close()
	var newGen int32
	for newGen <= old {
		pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		a.PollFetches(pctx)
		b.PollFetches(pctx)
		cancel()
		select {
		case g := <-gens:
			if g > newGen {
				newGen = g
			}
		default:
		}
		if ctx.Err() != nil {
			t.Fatal("no rebalance after B joined")
		}
	}
	// A's late renewal at the old generation is refused by the coordinator...
	for {
		if owned, ok, err = src.VerifyCurrent(ctx, a, p0, int64(old)); err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	if ok && owned == int64(old) {
		t.Fatalf("the coordinator accepted generation %d after the group moved to %d", old, newGen)
	}
	// ...and a write under the old token by the fence.
	s, err := memfence.New()
	if err != nil {
		t.Fatal(err)
	}
	k := fence.Key{Group: group, Topic: topic, Partition: 0}
	if _, err := s.Claim(ctx, k, fence.Token{Epoch: int64(newGen)}, "test"); err != nil {
		t.Fatal(err)
	}
	err = s.Apply(ctx, k, fence.Token{Epoch: int64(old)}, 0, 0, func(context.Context, *memfence.Tx) error { return nil })
	if !errors.Is(err, fence.ErrStale) {
		t.Fatalf("write under the old generation %d: %v, want ErrStale", old, err)
	}
	t.Logf("late renewal at generation %d refused after the group moved to %d", old, newGen)
}
