package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Grown partitions are assigned within seconds of the acknowledgement, not when the group
// leader's client next refreshes its metadata on its own (franz-go's MetadataMaxAge, 5 minutes
// by default, which the real-broker tests of growth shorten). For a standalone relay the new
// partitions are the new shards: rows appended under them would wait up to 5 minutes. The
// member's topic look (watchTopics) that saw the growth makes the client refresh its
// metadata, so the leader assigns the new partitions at once. The client here
// keeps franz-go's default MetadataMaxAge.
func TestGrownPartitionsAssignedWithoutWaitingForMetadataAge(t *testing.T) {
	brokers, store, clock, m, mb := startIdleCoord(t)
	ctx := context.Background()
	h, err := store.TopicHistory(ctx, "g", "coord")
	if err != nil || len(h) != 1 {
		t.Fatalf("stored identities %+v, %v", h, err)
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
	waitFor(t, "partitions 0 and 1 held (2 refusals)", 20*time.Second, func() bool { return m.sum(t, "baton.consumer.topic_refusals") >= 2 })
	after := before
	after.Partitions = 3
	if err := store.ResetTopic(ctx, "g", "coord", before, after, "test: growth acknowledged"); err != nil {
		t.Fatal(err)
	}
	// The member's look runs every 5 s; a rebalance and a claim follow: 30 s leaves room for
	// several, and is far below the 5 minutes of the metadata's own refresh.
	waitFor(t, "the new partition 2 assigned and its hook running after the acknowledgement", 30*time.Second,
		func() bool { return clock.ranSince(time.Time{}, 2) })
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
}
