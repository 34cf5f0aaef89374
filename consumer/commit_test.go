package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The group's committed offsets follow what the sink applied soon after each batch, not at
// franz-go's auto-commit interval (here an hour, so only Baton's own commits can move them):
// tools that read the group's lag from Kafka (kafka-consumer-groups, Burrow, KEDA) see the
// true lag.
func TestCommittedOffsetsFollowTheSink(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(2, "orders"))
	committedFollow(t, brokers, "orders", "g", fastKafka(brokers))
}

// The same on the real broker.
func TestRealCommittedOffsetsFollowTheSink(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	committedFollow(t, brokers, testenv.NewTopic(t, brokers, 2), testenv.UniqueName("g"), realKafka(brokers))
}

func committedFollow(t *testing.T, brokers []string, topic, group string, kafka []kgo.Opt) {
	const keys = 8
	store := newStore(t)
	c, err := consumer.New(group, []string{topic}, fence.Sink[*memfence.Tx](store), nil, consumer.PerPartition(newFolder().factory),
		consumer.Kafka(append(kafka, kgo.AutoCommitInterval(time.Hour))...), consumer.Logger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	start(t, c)
	adm, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	ctx := context.Background()
	for round := 1; round <= 3; round++ {
		produceSeq(t, brokers, topic, keys, 10*(round-1)+1, 10*round)
		waitFor(t, "the round applied", 30*time.Second, allApplied(store, keys, 10*round))
		ends, err := kadm.NewClient(adm).ListEndOffsets(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		// Within a second of the sink applying the last batch: far less than any auto-commit.
		waitFor(t, "the committed offsets reach the sink's positions", time.Second, func() bool {
			committed, err := kadm.NewClient(adm).FetchOffsets(ctx, group)
			if err != nil {
				return false
			}
			ok := true
			ends.Each(func(o kadm.ListedOffset) {
				c, found := committed.Lookup(o.Topic, o.Partition)
				ok = ok && found && c.At == o.Offset
			})
			return ok
		})
	}
}
