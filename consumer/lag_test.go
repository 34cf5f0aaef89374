package consumer_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// lagPoints returns the lag gauge's current value per partition, and fails the test if a
// point lacks the group attribute.
func lagPoints(t *testing.T, m *meter, group string) map[int64]int64 {
	t.Helper()
	out := map[int64]int64{}
	for _, sm := range m.collect(t).ScopeMetrics {
		for _, mt := range sm.Metrics {
			g, ok := mt.Data.(metricdata.Gauge[int64])
			if !ok || mt.Name != "baton.consumer.lag" {
				continue
			}
			for _, dp := range g.DataPoints {
				if v, _ := dp.Attributes.Value("baton.group"); v.AsString() != group {
					t.Fatalf("lag point without the group: %v", dp.Attributes.ToSlice())
				}
				p, _ := dp.Attributes.Value("messaging.destination.partition.id")
				out[p.AsInt64()] = dp.Value
			}
		}
	}
	return out
}

func total(m map[int64]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// The lag gauge is what the sink has not applied: while the sink fails every batch (fetching
// stops behind backpressure) it counts every record waiting, refreshed from the brokers'
// end offsets; after a partition is revoked the member reports no series for it.
func TestLagIsApplyLagAndEndsOnRevoke(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(2, "orders"))
	applyLag(t, brokers, "orders", "g", fastKafka(brokers))
}

// The same on the real broker.
func TestRealLagIsApplyLagAndEndsOnRevoke(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	applyLag(t, brokers, testenv.NewTopic(t, brokers, 2), testenv.UniqueName("g"), realKafka(brokers))
}

func applyLag(t *testing.T, brokers []string, topic, group string, kafka []kgo.Opt) {
	const keys = 16
	store := newStore(t)
	var stalled atomic.Bool
	fa := newFolder()
	fa.block = func(ctx context.Context, b *consumer.Batch) error {
		if stalled.Load() {
			return errTransient
		}
		return nil
	}
	ma := newMeter()
	opts := func(m *meter, f *folder) []consumer.Option {
		return []consumer.Option{consumer.PerPartition(f.factory), consumer.Kafka(kafka...), consumer.Logger(quiet),
			consumer.MeterProvider(m), consumer.RetryBackoff(20*time.Millisecond, 100*time.Millisecond),
			consumer.MaxInflightPerPartition(20), consumer.LagLook(200 * time.Millisecond)}
	}
	a, err := consumer.New(group, []string{topic}, fence.Sink[*memfence.Tx](store), nil, opts(ma, fa)...)
	if err != nil {
		t.Fatal(err)
	}
	start(t, a)
	produce(t, brokers, topic, keys, 2)
	waitFor(t, "the first records applied", 30*time.Second, allApplied(store, keys, 2))
	waitFor(t, "lag 0 on both partitions", 30*time.Second, func() bool {
		l := lagPoints(t, ma, group)
		return len(l) == 2 && total(l) == 0
	})

	stalled.Store(true)
	const waiting = keys * 20 // 320 records, far past the per-partition bound of 20
	produceSeq(t, brokers, topic, keys, 3, 12)
	time.Sleep(time.Second) // fetched until backpressure pauses both partitions: no fetch brings what follows
	produceSeq(t, brokers, topic, keys, 13, 22)
	waitFor(t, "the lag counts every record waiting", 30*time.Second, func() bool {
		return total(lagPoints(t, ma, group)) == waiting
	})

	// A second member: the rebalance revokes one partition from the first.
	mb := newMeter()
	b, err := consumer.New(group, []string{topic}, fence.Sink[*memfence.Tx](store), nil, opts(mb, newFolder())...)
	if err != nil {
		t.Fatal(err)
	}
	start(t, b)
	waitFor(t, "one partition each", 30*time.Second, func() bool {
		return a.Readiness().Assigned == 1 && b.Readiness().Assigned == 1
	})
	var la, lb map[int64]int64
	waitFor(t, "each member reports only its own partition", 30*time.Second, func() bool {
		la, lb = lagPoints(t, ma, group), lagPoints(t, mb, group)
		if len(la) != 1 || len(lb) != 1 {
			return false
		}
		for p := range la {
			if _, both := lb[p]; both {
				return false
			}
		}
		return true
	})
	t.Logf("stalled member: %v; the other: %v", la, lb)
	stalled.Store(false)
	waitFor(t, "everything applied", 30*time.Second, allApplied(store, keys, 22))
	waitFor(t, "lag 0", 30*time.Second, func() bool {
		return total(lagPoints(t, ma, group))+total(lagPoints(t, mb, group)) == 0
	})
}

// Every consumer series carries the group, and the counters of an assigned partition (and
// their outcomes known in advance) exist at 0 before their first event, so that increase()
// sees the first one.
func TestConsumerSeriesCarryGroupAndStartAtZero(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	store := newStore(t)
	m := newMeter()
	c, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](store), nil, consumer.PerPartition(newFolder().factory),
		consumer.Kafka(fastKafka(brokers)...), consumer.Logger(quiet), consumer.MeterProvider(m))
	if err != nil {
		t.Fatal(err)
	}
	start(t, c)
	produce(t, brokers, "orders", 2, 1)
	waitFor(t, "the records applied", 30*time.Second, allApplied(store, 2, 1))
	type series struct{ name, outcome string }
	zero := map[series]bool{}
	for _, s := range []series{{"baton.consumer.records.dead_lettered", ""}, {"baton.consumer.regressions", ""},
		{"baton.consumer.stale_refusals", ""}, {"baton.consumer.records.lost", ""}, {"baton.consumer.watchdog.stops", ""},
		{"baton.consumer.rebalances", "lost"}, {"baton.consumer.rebalances", "revoked"}, {"baton.consumer.retries", "apply"},
		{"baton.consumer.topic_refusals", "grown"}, {"baton.consumer.client_errors", "connect"}} {
		zero[s] = false
	}
	points := 0
	for _, sm := range m.collect(t).ScopeMetrics {
		for _, mt := range sm.Metrics {
			var sets []attribute.Set
			switch d := mt.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					sets = append(sets, dp.Attributes)
					o, _ := dp.Attributes.Value("baton.outcome")
					k, _ := dp.Attributes.Value("baton.error.kind")
					s := series{mt.Name, o.AsString() + k.AsString()}
					if _, want := zero[s]; want && dp.Value == 0 {
						zero[s] = true
					}
				}
			case metricdata.Gauge[int64]:
				for _, dp := range d.DataPoints {
					sets = append(sets, dp.Attributes)
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					sets = append(sets, dp.Attributes)
				}
			}
			for _, set := range sets {
				points++
				if v, _ := set.Value("baton.group"); v.AsString() != "g" {
					t.Errorf("%s point without the group: %v", mt.Name, set.ToSlice())
				}
			}
		}
	}
	if points == 0 {
		t.Fatal("no metric points")
	}
	for s, ok := range zero {
		if !ok {
			t.Errorf("%s %q has no point at 0 before its first event", s.name, s.outcome)
		}
	}
}
