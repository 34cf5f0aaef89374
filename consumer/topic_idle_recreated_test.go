package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kversion"
)

// An idle partition (a standalone relay's shard) whose topic is deleted and recreated with as
// many partitions (a new topic ID, no growth) stops running its after-commit hook once the
// member looks at the topic: the relay must not go on under the old incarnation. The
// watcher compares the ID, not only the partition count. The client fetches by topic name
// (Fetch below v13, as from a broker before Kafka 3.1), so no fetch is refused with
// UNKNOWN_TOPIC_ID to reveal the recreation: only the watcher's look does.
func TestIdleRecreatedTopicHoldsAfterCommit(t *testing.T) {
	brokers, store, clock, m, mb := startIdleCoord(t, kgo.MaxVersions(kversion.V3_0_0()))
	ctx := context.Background()
	h, err := store.TopicHistory(ctx, "g", "coord")
	if err != nil || len(h) != 1 {
		t.Fatalf("stored identities %+v, %v: want the one adopted by the claims", h, err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if r, err := adm.DeleteTopics(ctx, "coord"); err != nil || r.Error() != nil {
		t.Fatalf("deleting the topic: %v %v", err, r.Error())
	}
	r, err := adm.CreateTopic(ctx, 2, 1, nil, "coord")
	if err != nil || r.Err != nil {
		t.Fatalf("recreating the topic: %v %v", err, r.Err)
	}
	if r.ID.String() == h[0].Identity.ID {
		t.Fatalf("the recreated topic kept its ID %s", r.ID)
	}
	recreated := time.Now()
	// The member looks every 5 s (topicLook): after two looks the hooks must have stopped.
	deadline := recreated.Add(bound(11 * time.Second))
	for m.sum(t, "baton.consumer.topic_refusals") < 2 {
		if time.Now().After(deadline) {
			if clock.ranSince(time.Now().Add(-time.Second), 0, 1) {
				t.Fatalf("the after-commit hooks of partitions 0 and 1 still ran %v after the topic was recreated with a new ID: the watcher did not make the idle partitions compare the topic again",
					time.Since(recreated).Round(time.Second))
			}
			t.Fatalf("partitions 0 and 1 neither held nor running their hooks %v after the recreation", time.Since(recreated).Round(time.Second))
		}
		time.Sleep(50 * time.Millisecond)
	}
	held := time.Now()
	time.Sleep(300 * time.Millisecond) // fifteen idle intervals
	if clock.ranSince(held, 0) || clock.ranSince(held, 1) {
		t.Fatal("an after-commit hook ran while the recreated topic was held")
	}
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
}
