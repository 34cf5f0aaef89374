package consumer_test

import (
	"context"
	"errors"
	"maps"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
	"github.com/batonhq/baton/internal/testkit/netfreeze"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/partition"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// env848 is where a KIP-848 test runs: kfake always; the real broker when
// BATON_GROUP_PROTOCOL=consumer (make test-kip848 points BATON_KAFKA_BROKERS at Kafka 4.3).
type env848 struct {
	name string
	real bool
}

var envs848 = []env848{{"kfake", false}, {"kafka", true}}

// setup returns the brokers, a topic of n partitions and a group name.
func (e env848) setup(t *testing.T, n int32) (brokers []string, topic, group string) {
	t.Helper()
	if !e.real {
		brokers = fakeKafka(t, kfake.SeedTopics(n, "orders"), kfake.BrokerConfigs(map[string]string{
			"group.consumer.session.timeout.ms":    "3000",
			"group.consumer.heartbeat.interval.ms": "200",
		}))
		return brokers, "orders", "g"
	}
	if testenv.GroupProtocol() != consumer.ProtocolConsumer {
		t.Skipf("the real broker's KIP-848 tests run with %s=consumer against Kafka 4.3 (make test-kip848)", testenv.EnvGroupProtocol)
	}
	brokers = testenv.KafkaBrokers(t)
	return brokers, testenv.NewTopic(t, brokers, n), testenv.UniqueName("g")
}

// tokens records the token each member's factory was given, per partition, in order.
type tokens struct {
	mu sync.Mutex
	m  map[string][]fence.Token
}

func (r *tokens) factory(name string, f *folder) consumer.Factory[*memfence.Tx] {
	return func(ctx context.Context, k fence.Key, t fence.Token) (consumer.Handler[*memfence.Tx], error) {
		r.mu.Lock()
		if r.m == nil {
			r.m = map[string][]fence.Token{}
		}
		r.m[name] = append(r.m[name], t)
		r.mu.Unlock()
		return f.factory(ctx, k, t)
	}
}

func (r *tokens) of(name string) []fence.Token {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.m[name])
}

// A partition handed over from one KIP-848 member to another carries a strictly higher
// token, in the same era, from the assignment itself: no refused claim, no regression, no
// recovery, nothing lost or applied twice.
func TestAssignmentEpochsMonotonicAcrossTakeover(t *testing.T) {
	for _, e := range envs848 {
		t.Run(e.name, func(t *testing.T) {
			brokers, topic, group := e.setup(t, 1)
			const keys, n = 3, 10
			store := newStore(t)
			f := newFolder()
			var rec tokens
			mA, mB := newMeter(), newMeter()
			newMember := func(name string, m *meter) *consumer.Consumer[*memfence.Tx] {
				c, err := consumer.New(group, []string{topic}, fence.Sink[*memfence.Tx](store), nil, consumer.PerPartition(rec.factory(name, f)),
					consumer.Kafka(fastKafka(brokers)...), consumer.Logger(quiet), consumer.MeterProvider(m),
					consumer.GroupProtocol(consumer.ProtocolConsumer))
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			a := start(t, newMember("A", mA))
			produceSeq(t, brokers, topic, keys, 1, n/2)
			waitFor(t, "A applies the first half", 60*time.Second, allApplied(store, keys, n/2))
			b := start(t, newMember("B", mB))
			if err := a.stop(); err != nil {
				t.Fatalf("A: %v", err)
			}
			produceSeq(t, brokers, topic, keys, n/2+1, n)
			waitFor(t, "B takes over and applies the rest", 60*time.Second, allApplied(store, keys, n))
			if err := b.stop(); err != nil {
				t.Fatalf("B: %v", err)
			}
			ta, tb := rec.of("A"), rec.of("B")
			if len(ta) == 0 || len(tb) == 0 {
				t.Fatalf("tokens A %v, B %v: want both members to have claimed", ta, tb)
			}
			last, first := ta[len(ta)-1], tb[0]
			if first.Era != last.Era || first.Epoch <= last.Epoch {
				t.Errorf("B took the partition over at %s after A held it at %s: want a higher epoch in the same era", first, last)
			}
			if r := mA.sum(t, "baton.consumer.recoveries") + mB.sum(t, "baton.consumer.recoveries"); r != 0 {
				t.Errorf("%d recoveries in a plain takeover: the token was not monotonic", r)
			}
			// The epoch B was assigned at is above A's by itself: its first claim is accepted (a
			// refused one would be corrected by the proof, at the member's later epoch).
			if r := mB.sum(t, "baton.consumer.claims.stale"); r != 0 {
				t.Errorf("%d of B's claims refused as stale: its assignment epoch was not above A's", r)
			}
			checkFold(t, store, keys, n)
			if v := f.Violations(); len(v) > 0 {
				t.Fatalf("violations: %v", v)
			}
			t.Logf("A %v, B %v", ta, tb)
		})
	}
}

// A zombie of a KIP-848 group: member A pauses (network frozen) with a write on its way, past
// the group's session; B takes the partition over and applies everything. A's write, released,
// is refused as stale by the sink; A proves it is not the owner (no recovery over B).
func TestAssignmentEpochsZombieRefused(t *testing.T) {
	for _, e := range envs848 {
		t.Run(e.name, func(t *testing.T) {
			brokers, topic, group := e.setup(t, 1)
			const keys, n1, n = 3, 5, 20
			store := newStore(t)
			fz := netfreeze.New()
			f := newFolder()
			var rec tokens
			gate := newGatedSink(store)
			mA, mB := newMeter(), newMeter()
			a, err := consumer.New(group, []string{topic}, fence.Sink[*memfence.Tx](gate), nil, consumer.PerPartition(rec.factory("A", f)),
				consumer.Kafka(append(fastKafka(brokers), kgo.Dialer(fz.Dial), kgo.RequestTimeoutOverhead(time.Second))...),
				consumer.Logger(quiet), consumer.MeterProvider(mA), consumer.GroupProtocol(consumer.ProtocolConsumer))
			if err != nil {
				t.Fatal(err)
			}
			ma := start(t, a)
			produceSeq(t, brokers, topic, keys, 1, n1)
			waitFor(t, "A applies the first records", 60*time.Second, allApplied(store, keys, n1))
			gate.arm()
			produceSeq(t, brokers, topic, keys, n1+1, n1+1)
			<-gate.entered // A's worker is between deciding to write and writing
			fz.Freeze()
			defer fz.Thaw()

			b, err := consumer.New(group, []string{topic}, fence.Sink[*memfence.Tx](store), nil, consumer.PerPartition(rec.factory("B", f)),
				consumer.Kafka(fastKafka(brokers)...), consumer.Logger(quiet), consumer.MeterProvider(mB),
				consumer.GroupProtocol(consumer.ProtocolConsumer))
			if err != nil {
				t.Fatal(err)
			}
			mb := start(t, b)
			produceSeq(t, brokers, topic, keys, n1+2, n)
			waitFor(t, "B takes over (A's session expired) and applies everything", 90*time.Second, allApplied(store, keys, n))

			close(gate.release)
			if err := <-gate.result; !errors.Is(err, fence.ErrStale) {
				t.Fatalf("the zombie's write returned %v, want a stale refusal", err)
			}
			fz.Thaw()
			waitFor(t, "A counts the refusal", 60*time.Second, func() bool { return mA.sum(t, "baton.consumer.stale_refusals") >= 1 })
			if err := ma.stop(); err != nil {
				t.Fatalf("A: %v", err)
			}
			if err := mb.stop(); err != nil {
				t.Fatalf("B: %v", err)
			}
			if r := mA.sum(t, "baton.consumer.recoveries") + mB.sum(t, "baton.consumer.recoveries"); r != 0 {
				t.Errorf("%d recoveries: a zombie proved itself current", r)
			}
			checkFold(t, store, keys, n)
			if v := f.Violations(); len(v) > 0 {
				t.Fatalf("violations: %v", v)
			}
			t.Logf("A %v, B %v", rec.of("A"), rec.of("B"))
		})
	}
}

// member848 is a bare franz-go KIP-848 member and the partitions it holds.
type member848 struct {
	cl *kgo.Client
	mu sync.Mutex
	ps map[int32]bool
}

func join848(t *testing.T, brokers []string, group, topic string, dial func(context.Context, string, string) (net.Conn, error)) *member848 {
	t.Helper()
	m := &member848{ps: map[int32]bool{}}
	opts := []kgo.Opt{
		kgo.SeedBrokers(brokers...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.ServerSideBalancer(), kgo.FetchMaxWait(100 * time.Millisecond), kgo.MetadataMinAge(100 * time.Millisecond),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, a map[string][]int32) { m.set(a[topic], true) }),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, r map[string][]int32) { m.set(r[topic], false) }),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, l map[string][]int32) { m.set(l[topic], false) }),
	}
	if dial != nil {
		opts = append(opts, kgo.Dialer(dial), kgo.RequestTimeoutOverhead(time.Second))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	m.cl = cl
	t.Cleanup(cl.Close)
	go func() { // a member must poll for its group session to make progress
		for {
			if fs := cl.PollFetches(context.Background()); fs.IsClientClosed() {
				return
			}
		}
	}()
	return m
}

func (m *member848) set(ps []int32, on bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range ps {
		if on {
			m.ps[p] = true
		} else {
			delete(m.ps, p)
		}
	}
}

func (m *member848) held() []int32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Sorted(maps.Keys(m.ps))
}

// The KIP-848 currentness proof, part by part, against the coordinator's answers: it confirms
// the owner; it refuses a live member for a partition that moved away, even at the member's
// current epoch, where the OffsetCommit alone checks no partition (so the description is what
// refuses); it proves a partition that came back at the epoch it came back at, not the old
// one; and it refuses a member fenced after its session expired, by both requests.
func TestAssignmentEpochsProof(t *testing.T) {
	for _, e := range envs848 {
		t.Run(e.name, func(t *testing.T) {
			brokers, topic, group := e.setup(t, 2)
			ctx := testenv.Context(t, 2*time.Minute)
			fz := netfreeze.New()
			defer fz.Thaw()
			a := join848(t, brokers, group, topic, fz.Dial)
			waitFor(t, "A holds both partitions", 60*time.Second, func() bool { return len(a.held()) == 2 })
			memberA, eA := a.cl.GroupMetadata()
			p0, p1 := partition.ID{Topic: topic, Partition: 0}, partition.ID{Topic: topic, Partition: 1}
			for _, p := range []partition.ID{p0, p1} {
				owned, ok, err := consumer.ProveOwned848(ctx, a.cl, memberA, p, int64(eA))
				if err != nil || !ok || owned != int64(eA) {
					t.Fatalf("owner A of %s at epoch %d: proof (%d, %v, %v), want (%d, true, nil)", p, eA, owned, ok, err, eA)
				}
			}

			b := join848(t, brokers, group, topic, nil)
			waitFor(t, "B takes one partition", 60*time.Second, func() bool { return len(b.held()) == 1 && len(a.held()) == 1 })
			moved := partition.ID{Topic: topic, Partition: b.held()[0]}
			var eNow int32
			waitFor(t, "A's epoch moves past the revocation", 60*time.Second, func() bool {
				_, eNow = a.cl.GroupMetadata()
				return eNow > eA
			})
			// At A's current epoch the commit checks no partition: it is accepted...
			if ok, err := consumer.CommitProof848(ctx, a.cl, moved, memberA, int64(eNow)); err != nil || !ok {
				t.Logf("commit of %s by A at its current epoch %d: (%v, %v) (the member moved on meanwhile?)", moved, eNow, ok, err)
			}
			// ...and the proof refuses all the same, because the description does not list it.
			for _, ep := range []int32{eA, eNow} {
				if owned, ok, err := consumer.ProveOwned848(ctx, a.cl, memberA, moved, int64(ep)); ok || err != nil {
					t.Errorf("A for %s (now B's) at epoch %d: proof (%d, %v, %v), want a refusal", moved, ep, owned, ok, err)
				}
			}
			if e.real {
				// KIP-1251 (Kafka 4.3): an older epoch is checked against the partition's
				// assignment: refused for a partition that is not the member's.
				if ok, err := consumer.CommitProof848(ctx, a.cl, moved, memberA, int64(eA)); ok || err != nil {
					t.Errorf("commit of %s (now B's) by A at its older epoch %d: (%v, %v), want STALE_MEMBER_EPOCH", moved, eA, ok, err)
				}
			}

			// B leaves: the partition comes back to A at a later epoch, proven at that epoch.
			b.cl.Close()
			waitFor(t, "A holds both partitions again", 60*time.Second, func() bool { return len(a.held()) == 2 })
			_, eBack := a.cl.GroupMetadata()
			owned, ok, err := consumer.ProveOwned848(ctx, a.cl, memberA, moved, int64(eA))
			if err != nil || !ok || owned <= int64(eA) || owned > int64(eBack) {
				t.Errorf("A for %s, assigned again after epoch %d (now %d): proof at %d gave (%d, %v, %v), want ownership at the later epoch", moved, eA, eBack, eA, owned, ok, err)
			}

			// A is frozen past its session; C takes everything. A's member is fenced: both
			// requests refuse it, asked through C's connection.
			fz.Freeze()
			c := join848(t, brokers, group, topic, nil)
			waitFor(t, "C holds both partitions after A's session expired", 90*time.Second, func() bool { return len(c.held()) == 2 })
			for _, p := range []partition.ID{p0, p1} {
				if owned, ok, err := consumer.ProveOwned848(ctx, c.cl, memberA, p, int64(eBack)); ok || err != nil {
					t.Errorf("fenced A for %s at %d: proof (%d, %v, %v), want a refusal", p, eBack, owned, ok, err)
				}
				if ok, err := consumer.CommitProof848(ctx, c.cl, p, memberA, int64(eBack)); ok || err != nil {
					t.Errorf("fenced A's commit of %s at %d: (%v, %v), want UNKNOWN_MEMBER_ID", p, eBack, ok, err)
				}
			}
			fz.Thaw()
		})
	}
}

// New validates the protocol against the epoch source.
func TestGroupProtocolValidated(t *testing.T) {
	brokers := []string{"127.0.0.1:1"}
	mk := func(opts ...consumer.Option) error {
		_, err := consumer.New("g", []string{"orders"}, newStore(t), nil,
			append([]consumer.Option{consumer.PerPartition(newFolder().factory), consumer.Kafka(kgo.SeedBrokers(brokers...))}, opts...)...)
		return err
	}
	for _, c := range []struct {
		name string
		opts []consumer.Option
		ok   bool
	}{
		{"default", nil, true},
		{"consumer", []consumer.Option{consumer.GroupProtocol(consumer.ProtocolConsumer)}, true},
		{"classic", []consumer.Option{consumer.GroupProtocol(consumer.ProtocolClassic)}, true},
		{"source selects", []consumer.Option{consumer.Epochs(consumer.AssignmentEpochs())}, true},
		{"both consumer", []consumer.Option{consumer.Epochs(consumer.AssignmentEpochs()), consumer.GroupProtocol(consumer.ProtocolConsumer)}, true},
		{"unknown", []consumer.Option{consumer.GroupProtocol("eager")}, false},
		{"consumer with generations", []consumer.Option{consumer.GroupProtocol(consumer.ProtocolConsumer), consumer.Epochs(consumer.ClassicGeneration())}, false},
		{"classic with assignment epochs", []consumer.Option{consumer.Epochs(consumer.AssignmentEpochs()), consumer.GroupProtocol(consumer.ProtocolClassic)}, false},
	} {
		err := mk(c.opts...)
		if (err == nil) != c.ok {
			t.Errorf("%s: New returned %v, want ok=%v", c.name, err, c.ok)
		}
		if err != nil && !errors.Is(err, consumer.ErrInvalidOption) {
			t.Errorf("%s: %v does not match ErrInvalidOption", c.name, err)
		}
	}
}

// A KIP-848 consumer that franz-go cannot run as one (here: a balancer the consumer protocol
// does not offer, so franz-go joins with the classic protocol) fails Run at its first
// assignment rather than running under tokens of the wrong protocol.
func TestAssignmentEpochsRefuseClassicFallback(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	// Records to fetch: Run notices a failed assignment when its poll returns (a poll of an
	// empty topic waits for its context).
	produceSeq(t, brokers, "orders", 1, 1, 1)
	c, err := consumer.New("g", []string{"orders"}, newStore(t), nil, consumer.PerPartition(newFolder().factory),
		consumer.Kafka(append(fastKafka(brokers), kgo.Balancers(kgo.RoundRobinBalancer()))...),
		consumer.Logger(quiet), consumer.GroupProtocol(consumer.ProtocolConsumer))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = c.Run(ctx)
	if err == nil || ctx.Err() != nil || !errors.Is(err, consumer.ErrNotConsumerGroup) {
		t.Fatalf("Run returned %v (ctx %v), want the classic fallback refused", err, ctx.Err())
	}
}
