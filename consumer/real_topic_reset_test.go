package consumer_test

import (
	"encoding/base64"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// A reset topic is read from its beginning, not from the committed offset: ResetTopic moves the
// fences to a new era with no position, and DESIGN.md promises that the
// new incarnation is then "read from its beginning". But a claim with no position does not
// seek (claimResolved seeks only to position+1): the fetch starts at Kafka's committed offset
// for the group. A committed offset that names the old incarnation's offsets and lands inside
// the new incarnation's log (a commit of marks that raced the deletion, offsets synced by a
// mirror, tooling) makes the member skip the new incarnation's records below it, silently:
// lost() is not consulted with no position. So claimResolved seeks a claim with no position in
// a fence of a later era than 0 (moved by a reset or a recovery) to offset 0; without that
// case 48 of 72 records are applied.
//
// The interleaving reproduced: the member applies the old incarnation and stops; the topic is
// deleted and recreated; producers write more to the new incarnation than the old one held;
// the old incarnation's end offsets are committed for the group (standing for the late
// commit); a member starts, is held, the operator resets the topic; every record of the new
// incarnation must be applied.
func TestRealTopicResetResumesAtCommittedOffset(t *testing.T) {

	brokers := testenv.KafkaBrokers(t)
	pool, sink := newPGLog(t)
	topic := testenv.NewTopic(t, brokers, 3)
	group := testenv.UniqueName("g")
	ctx := testenv.Context(t, 4*time.Minute)
	adm := admin(t, brokers)
	const keys = 6
	produceSeq(t, brokers, topic, keys, 1, 4)
	newConsumer := func(m *meter) *consumer.Consumer[pgx.Tx] {
		c, err := consumer.New(group, []string{topic}, sink, nil, consumer.PerPartition(pgLogFolder(nil)), consumer.Kafka(append(realKafka(brokers), kgo.MetadataMinAge(500*time.Millisecond), kgo.MetadataMaxAge(2*time.Second))...),
			consumer.Logger(quiet), consumer.MeterProvider(m), consumer.RetryBackoff(50*time.Millisecond, time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	mb := start(t, newConsumer(newMeter()))
	waitFor(t, "the first incarnation applied", 2*time.Minute, func() bool { return pgApplied(t, pool) == keys*4 })
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	before := brokerTopic(t, brokers, topic)
	oldEnd, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}

	if r, err := adm.DeleteTopic(ctx, topic); err != nil || r.Err != nil {
		t.Fatalf("delete topic: %v %v", err, r.Err)
	}
	waitFor(t, "the topic recreated", time.Minute, func() bool {
		r, err := adm.CreateTopic(ctx, 3, 1, nil, topic)
		return err == nil && (r.Err == nil || errors.Is(r.Err, kerr.TopicAlreadyExists) && brokerTopicOK(t, brokers, topic, before.ID))
	})
	waitFor(t, "the new incarnation described", time.Minute, func() bool {
		td, err := adm.ListTopics(ctx, topic)
		d, ok := td[topic]
		return err == nil && ok && d.Err == nil && len(d.Partitions) == 3 && topicIDString(d.ID) != before.ID
	})
	after := brokerTopic(t, brokers, topic)
	if after.ID == before.ID || after.ID == "" {
		t.Fatalf("topic ID %q after the recreation, %q before: the fault did not happen", after.ID, before.ID)
	}
	produceSeq(t, brokers, topic, keys, 5, 12) // twice what the old incarnation held
	// The fault: the old incarnation's offsets committed for the group, inside the new log.
	newEnd, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	inside := false
	oldEnd.Each(func(o kadm.ListedOffset) {
		if n, ok := newEnd.Lookup(topic, o.Partition); ok && o.Offset > 0 && o.Offset < n.Offset {
			inside = true
		}
	})
	if !inside {
		t.Fatalf("no old end offset %v inside the new log %v: the fault cannot happen", oldEnd, newEnd)
	}
	cr, err := adm.CommitOffsets(ctx, group, oldEnd.Offsets())
	if err == nil {
		err = cr.Error()
	}
	if err != nil {
		t.Fatalf("commit the old incarnation's offsets: %v", err)
	}

	m := newMeter()
	mb = start(t, newConsumer(m))
	waitFor(t, "the recreated topic refused", 2*time.Minute, func() bool { return m.sum(t, "baton.consumer.topic_refusals") >= 1 })
	if err := sink.ResetTopic(ctx, group, topic, before, after, "test: topic recreated"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for pgApplied(t, pool) < keys*12 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	if n := pgApplied(t, pool); n != keys*12 {
		t.Fatalf("%d records applied after the reset, want %d: the new incarnation's records below the old committed offsets were skipped", n, keys*12)
	}
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	keyOrder(t, pool, keys, 12)
}

// topicIDString is Kafka's text form of a topic ID (kadm's String is the same base64).
func topicIDString(id kadm.TopicID) string { return base64.RawURLEncoding.EncodeToString(id[:]) }
