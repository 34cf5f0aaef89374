package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/partition"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The KIP-848 fallback on an unsupported broker: the fallback franz-go actually performs is
// the one on UNSUPPORTED_VERSION from ConsumerGroupHeartbeat, which a Kafka 4.x broker answers
// when the consumer protocol is off (group.coordinator.rebalance.protocols without "consumer",
// or group.version < 1: KafkaApis.isConsumerGroupProtocolEnabled). The same broker answers
// ConsumerGroupDescribe with UNSUPPORTED_VERSION for every group, not GROUP_ID_NOT_FOUND, so
// AssignedEpoch took the classic generation as the token, the worker claimed under it, and
// its proof retried "cannot tell" for ever: Run never failed, the partition stalled silently.
// kfake plays that broker: both APIs answer UNSUPPORTED_VERSION.
func TestAssignmentEpochsRefuseBrokerFallback(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"),
		kfake.BrokerConfigs(map[string]string{"group.min.session.timeout.ms": "500"}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var described, heartbeats int
	c.ControlKey(kmsg.ConsumerGroupHeartbeat.Int16(), func(r kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		heartbeats++
		resp := r.ResponseKind().(*kmsg.ConsumerGroupHeartbeatResponse)
		resp.ErrorCode = kerr.UnsupportedVersion.Code
		return resp, nil, true
	})
	c.ControlKey(kmsg.ConsumerGroupDescribe.Int16(), func(r kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		described++
		req := r.(*kmsg.ConsumerGroupDescribeRequest)
		resp := req.ResponseKind().(*kmsg.ConsumerGroupDescribeResponse)
		for _, g := range req.Groups {
			dg := kmsg.NewConsumerGroupDescribeResponseGroup()
			dg.Group, dg.ErrorCode = g, kerr.UnsupportedVersion.Code
			resp.Groups = append(resp.Groups, dg)
		}
		return resp, nil, true
	})
	brokers := c.ListenAddrs()
	produceSeq(t, brokers, "orders", 1, 1, 1)
	store := newStore(t)
	cons, err := consumer.New("g", []string{"orders"}, store, nil, consumer.PerPartition(newFolder().factory),
		consumer.Kafka(fastKafka(brokers)...), consumer.Logger(quiet), consumer.GroupProtocol(consumer.ProtocolConsumer))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = cons.Run(ctx)
	if heartbeats == 0 {
		t.Fatalf("franz-go never tried the consumer protocol: the fallback this test is about did not happen")
	}
	if err == nil || ctx.Err() != nil || !errors.Is(err, consumer.ErrNotConsumerGroup) {
		t.Errorf("Run returned %v (ctx %v) after %d descriptions, want the classic fallback refused", err, ctx.Err(), described)
	}
	// No claim under the classic generation either.
	st, lerr := store.Load(context.Background(), partition.ID{Topic: "orders", Partition: 0}.Key("g"))
	if lerr != nil {
		t.Fatal(lerr)
	}
	if st.Token.Epoch != 0 {
		t.Errorf("the fence holds %s: a KIP-848 consumer claimed under the classic protocol's generation", st.Token)
	}
}

// A KIP-848 member rejoining in place: franz-go answers FENCED_MEMBER_EPOCH or
// STALE_MEMBER_EPOCH by abandoning every partition (OnPartitionsLost) and rejoining at epoch 0
// with the SAME member id; the coordinator re-admits the member in place, at the same member
// epoch with the same assignment (Kafka's GroupMetadataManager: "Epoch 0 ... (re)join", the
// member is kept; kfake's consumerRejoin does the same). Each partition comes back to a new
// worker (a new claimant) with the token the old worker claimed: an equal token held by
// another claimant, so the claim is refused and the partition needs a recorded regression
// recovery (an era bump, logged as an ERROR "epoch regression"), or, with
// RecoverRegressions(false), is left unprocessed for good. Under the classic protocol a
// rejoin always brings a new generation. Here one heartbeat is answered FENCED_MEMBER_EPOCH.
func TestAssignmentEpochsRejoinInPlace(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"),
		kfake.BrokerConfigs(map[string]string{
			"group.min.session.timeout.ms":         "500",
			"group.consumer.session.timeout.ms":    "3000",
			"group.consumer.heartbeat.interval.ms": "200",
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := c.ListenAddrs()
	const keys, n1, n = 2, 3, 6
	store := newStore(t)
	m := newMeter()
	cons, err := consumer.New("g", []string{"orders"}, store, nil, consumer.PerPartition(newFolder().factory),
		consumer.Kafka(fastKafka(brokers)...), consumer.Logger(quiet), consumer.MeterProvider(m),
		consumer.GroupProtocol(consumer.ProtocolConsumer), consumer.RecoverRegressions(false))
	if err != nil {
		t.Fatal(err)
	}
	r := start(t, cons)
	produceSeq(t, brokers, "orders", keys, 1, n1)
	waitFor(t, "the first records applied", 30*time.Second, allApplied(store, keys, n1))
	var fenced atomic.Bool
	c.ControlKey(kmsg.ConsumerGroupHeartbeat.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		hb := req.(*kmsg.ConsumerGroupHeartbeatRequest)
		if hb.MemberEpoch <= 0 {
			c.KeepControl()
			return nil, nil, false
		}
		fenced.Store(true)
		resp := hb.ResponseKind().(*kmsg.ConsumerGroupHeartbeatResponse)
		resp.ErrorCode = kerr.FencedMemberEpoch.Code
		return resp, nil, true
	})
	waitFor(t, "one heartbeat fenced", 30*time.Second, fenced.Load)
	produceSeq(t, brokers, "orders", keys, n1+1, n)
	ok, done := false, allApplied(store, keys, n)
	for deadline := time.Now().Add(20 * time.Second); !ok && time.Now().Before(deadline) && m.sum(t, "baton.consumer.regressions") == 0; time.Sleep(20 * time.Millisecond) {
		ok = done()
	}
	if err := r.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	if rg := m.sum(t, "baton.consumer.regressions"); rg != 0 || !ok {
		t.Errorf("after an in-place rejoin: %d regressions, rest applied %v: the same member's own partition, back at the same epoch, needed a recovery", rg, ok)
	}
}

// A user's server-side balancer without GroupProtocol: kgo.ServerSideBalancer among the Kafka
// options, without GroupProtocol, makes franz-go join as a KIP-848 member while Baton keeps
// the classic protocol's epoch source: the member epoch is taken as a generation, and the
// classic proof's DescribeGroups answers GROUP_ID_NOT_FOUND for a consumer group, so every
// partition's proof retries "cannot tell" for ever and nothing is applied, with no error from
// New or Run. Want: New (or Run) refuses the combination, or GroupProtocol follows it.
func TestUserServerSideBalancerWithClassicSource(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	produceSeq(t, brokers, "orders", 1, 1, 2)
	store := newStore(t)
	cons, err := consumer.New("g", []string{"orders"}, store, nil, consumer.PerPartition(newFolder().factory),
		consumer.Kafka(append(fastKafka(brokers), kgo.ServerSideBalancer())...), consumer.Logger(quiet))
	if err != nil {
		if !errors.Is(err, consumer.ErrInvalidOption) {
			t.Fatalf("New: %v, want ErrInvalidOption", err)
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cons.Run(ctx) }()
	applied := allApplied(store, 1, 2)
	ran := false
	for !ran && !applied() && ctx.Err() == nil {
		select {
		case err = <-done:
			ran = true
		case <-time.After(20 * time.Millisecond):
		}
	}
	cancel()
	if !ran {
		err = <-done
	}
	if !applied() && !errors.Is(err, consumer.ErrInvalidOption) {
		t.Errorf("kgo.ServerSideBalancer with the classic epoch source: nothing applied in 20 s and Run returned %v: a silent stall", err)
	}
}
