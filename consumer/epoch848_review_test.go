package consumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/partition"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Review finding "FallbackUnsupported" (rev-848): the fallback franz-go actually performs is
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
	cons, err := consumer.New("g", []string{"orders"}, store, newFolder().factory,
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
