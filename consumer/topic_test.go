package consumer_test

import (
	"context"
	"encoding/base64"

	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
)

// The topic's identity: a topic recreated under the same name, or grown, is compared
// with the identity stored with the fences after every claim, and held until an operator
// resets it.

// topicOf returns the topic's identity as the brokers describe it (Kafka's text form of the ID).
func brokerTopic(t *testing.T, brokers []string, topic string) fence.Topic {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	td, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	d, ok := td[topic]
	if !ok || d.Err != nil {
		t.Fatalf("topic %s: %v", topic, d.Err)
	}
	return fence.Topic{ID: base64.RawURLEncoding.EncodeToString(d.ID[:]), Partitions: int32(len(d.Partitions))}
}

// oldIncarnation makes store hold what a deleted incarnation of topic left: the identity
// "deleted-incarnation" and, for partition 0, a fence at position 20 held by another claimant
// with the lowest token (so the consumer's claim is accepted at once).
func oldIncarnation(t *testing.T, store *memfence.Store, topic string) fence.Topic {
	t.Helper()
	ctx := context.Background()
	old := fence.Topic{ID: "deleted-incarnation", Partitions: 1}
	if _, _, err := store.SeeTopic(ctx, "g", topic, old, "test: the deleted incarnation"); err != nil {
		t.Fatal(err)
	}
	k := fence.Key{Group: "g", Topic: topic, Partition: 0}
	if _, err := store.Claim(ctx, k, fence.Token{}, "old-owner"); err != nil {
		t.Fatal(err)
	}
	if err := store.Apply(ctx, k, fence.Token{}, 0, 20, nil); err != nil {
		t.Fatal(err)
	}
	return old
}

// A recreated topic (its ID differs from the one stored with the fences, whose position 20
// counts the old incarnation's offsets) is held: nothing is applied, the refusal is counted,
// until the operator's reset; then every record of the new incarnation is applied once,
// none skipped as "already applied". (Mutant TopicIdentityUnchecked: the claim resumes at 20
// and the new log's records 0..9 are filtered out as applied.)
func TestRecreatedTopicHeldUntilReset(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	const keys, n = 2, 5
	produce(t, brokers, "orders", keys, n)
	store := newStore(t)
	old := oldIncarnation(t, store, "orders")
	now := brokerTopic(t, brokers, "orders")
	if now.ID == old.ID || now.ID == "" {
		t.Fatalf("the broker's topic ID %q must differ from the stored %q", now.ID, old.ID)
	}
	m := newMeter()
	f := newFolder()
	c, err := consumer.New("g", []string{"orders"}, store, nil, consumer.PerPartition(f.factory), consumer.Kafka(fastKafka(brokers)...),
		consumer.Logger(quiet), consumer.MeterProvider(m), consumer.RetryBackoff(10*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	waitFor(t, "the recreated topic refused (or its records skipped)", 30*time.Second, func() bool {
		return m.sum(t, "baton.consumer.topic_refusals") >= 1 || m.sum(t, "baton.consumer.records.duplicates_skipped") > 0
	})
	if d := m.sum(t, "baton.consumer.records.duplicates_skipped"); d > 0 {
		t.Fatalf("%d records of the recreated topic skipped as applied: the claim resumed at the old incarnation's position", d)
	}
	time.Sleep(500 * time.Millisecond) // several looks at the topic: still held
	if _, ok := store.Get("k/k0"); ok {
		t.Fatal("records of the recreated topic applied before the reset")
	}
	if err := store.ResetTopic(context.Background(), "g", "orders", old, now, "test: topic recreated"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every record of the new incarnation applied", 30*time.Second, allApplied(store, keys, n))
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	checkFold(t, store, keys, n)
	if v := f.Violations(); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
	rs, err := store.Recoveries(context.Background(), fence.Key{Group: "g", Topic: "orders", Partition: 0})
	if err != nil || len(rs) != 1 || rs[0].Reason != "test: topic recreated" {
		t.Fatalf("recoveries %+v, %v: want the reset recorded", rs, err)
	}
}

// resetOnSee is memfence whose first SeeTopic is preceded by an operator's reset of the
// topic: the reset lands between the consumer's claim and its comparison of the topic.
type resetOnSee struct {
	*memfence.Store
	once     sync.Once
	from, to fence.Topic
}

func (s *resetOnSee) SeeTopic(ctx context.Context, group, topic string, seen fence.Topic, reason string) (fence.Topic, bool, error) {
	s.once.Do(func() {
		if err := s.ResetTopic(ctx, group, topic, s.from, s.to, "test: reset between claim and compare"); err != nil {
			panic(err)
		}
	})
	return s.Store.SeeTopic(ctx, group, topic, seen, reason)
}

// A reset between the claim and the comparison: the comparison then sees the new identity,
// but the claim's position (20) counts the old incarnation's offsets. The consumer confirms
// after the comparison that the fence still holds its token; the reset moved it to a new era,
// so it claims afresh and resumes at the new incarnation's beginning. (Mutant
// TopicResetNotConfirmed: it resumes at 20 and every record is filtered out as applied.)
func TestTopicResetBetweenClaimAndCompare(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	const keys, n = 2, 5
	produce(t, brokers, "orders", keys, n)
	store := newStore(t)
	old := oldIncarnation(t, store, "orders")
	sink := &resetOnSee{Store: store, from: old, to: brokerTopic(t, brokers, "orders")}
	f := newFolder()
	m := newMeter()
	c, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](sink), nil, consumer.PerPartition(f.factory), consumer.Kafka(fastKafka(brokers)...),
		consumer.Logger(quiet), consumer.MeterProvider(m), consumer.RetryBackoff(10*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	applied := allApplied(store, keys, n)
	waitFor(t, "every record of the new incarnation applied (or some skipped)", 30*time.Second, func() bool {
		return applied() || m.sum(t, "baton.consumer.records.duplicates_skipped") > 0
	})
	if d := m.sum(t, "baton.consumer.records.duplicates_skipped"); d > 0 {
		t.Fatalf("%d records of the new incarnation skipped as applied: the claim resumed at the old incarnation's position", d)
	}
	waitFor(t, "every record of the new incarnation applied", 30*time.Second, applied)
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	checkFold(t, store, keys, n)
	if h, _ := store.TopicHistory(context.Background(), "g", "orders"); len(h) != 2 {
		t.Fatalf("topic history %+v: want the seeded identity and the reset", h)
	}
}

// A grown topic (3 partitions, 2 acknowledged) is held, all of it: growing a topic moves keys
// between all its partitions, old and new. Nothing is applied and the refusal is counted until
// the operator acknowledges the growth; then every record is applied once. (Mutant
// GrownPartitionNotHeld: applied at once.)
func TestGrownTopicHeldUntilAcknowledged(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(3, "orders"))
	const keys, n = 12, 4
	produce(t, brokers, "orders", keys, n)
	store := newStore(t)
	ctx := context.Background()
	now := brokerTopic(t, brokers, "orders")
	two := fence.Topic{ID: now.ID, Partitions: 2}
	if _, _, err := store.SeeTopic(ctx, "g", "orders", two, "test: seen before the growth"); err != nil {
		t.Fatal(err)
	}
	m := newMeter()
	f := newFolder()
	c, err := consumer.New("g", []string{"orders"}, store, nil, consumer.PerPartition(f.factory), consumer.Kafka(fastKafka(brokers)...),
		consumer.Logger(quiet), consumer.MeterProvider(m), consumer.RetryBackoff(10*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	waitFor(t, "the grown topic refused (or records applied)", 30*time.Second, func() bool {
		return m.sum(t, "baton.consumer.topic_refusals") >= 3 || m.sum(t, "baton.consumer.records.applied") > 0
	})
	time.Sleep(500 * time.Millisecond) // several looks at the topic: still held
	for p := int32(0); p < 3; p++ {
		if st, _ := store.Load(ctx, fence.Key{Group: "g", Topic: "orders", Partition: p}); st.Position != fence.NoPosition {
			t.Fatalf("partition %d applied up to %d before the growth was acknowledged", p, st.Position)
		}
	}
	if err := store.ResetTopic(ctx, "g", "orders", two, now, "test: growth acknowledged"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every record applied after the acknowledgement", 30*time.Second, allApplied(store, keys, n))
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	checkFold(t, store, keys, n)
	if v := f.Violations(); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
}

// Records deleted from the log (DeleteRecords, as retention does) before they were applied are
// reported as data loss: counted, and processing goes on with what the log still has. (Mutant
// DataLossUnreported: they are skipped silently.)
func TestDeletedRecordsReportedAsLoss(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	produce(t, brokers, "orders", 1, 10) // offsets 0..9
	store := newStore(t)
	ctx := context.Background()
	k := fence.Key{Group: "g", Topic: "orders", Partition: 0}
	if _, err := store.Claim(ctx, k, fence.Token{}, "old-owner"); err != nil {
		t.Fatal(err)
	}
	if err := store.Apply(ctx, k, fence.Token{}, 0, 2, nil); err != nil { // applied 0..2
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	dr, err := kadm.NewClient(cl).DeleteRecords(ctx, kadm.Offsets{"orders": {0: {At: 6}}})
	cl.Close()
	if err != nil || dr.Error() != nil {
		t.Fatalf("delete records: %v %v", err, dr.Error())
	}
	m := newMeter()
	c, err := consumer.New("g", []string{"orders"}, store, nil, consumer.PerPartition(consumer.Factory[*memfence.Tx](func(context.Context, fence.Key, fence.Token) (consumer.Handler[*memfence.Tx], error) {
		return consumer.Handler[*memfence.Tx](func(context.Context, *memfence.Tx, *consumer.Batch) error { return nil }), nil
	})), consumer.Kafka(fastKafka(brokers)...), consumer.Logger(quiet), consumer.MeterProvider(m))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	waitFor(t, "the records left applied", 30*time.Second, func() bool {
		st, _ := store.Load(ctx, k)
		return st.Position == 9
	})
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	if got := m.sum(t, "baton.consumer.records.lost"); got != 3 {
		t.Fatalf("records lost counted %d, want 3 (offsets 3..5 deleted before they were applied)", got)
	}
}

// staleTopicView is memfence whose partition-0 claim is followed by Metadata answers naming
// the topic with another ID (until the topic's comparison): the claim compares an incarnation
// of the topic (other) that is not the one its records are then fetched from, as when the
// topic is deleted and recreated between the comparison and the fetch.
type staleTopicView struct {
	*memfence.Store
	claimed sync.Once
	lie     atomic.Bool
}

func (s *staleTopicView) Claim(ctx context.Context, k fence.Key, t fence.Token, claimant string) (fence.State, error) {
	if k.Partition == 0 {
		s.claimed.Do(func() { s.lie.Store(true) })
	}
	return s.Store.Claim(ctx, k, t, claimant)
}

func (s *staleTopicView) SeeTopic(ctx context.Context, group, topic string, seen fence.Topic, reason string) (fence.Topic, bool, error) {
	s.lie.Store(false)
	return s.Store.SeeTopic(ctx, group, topic, seen, reason)
}

// A fetched batch whose topic ID is not the one its claim compared (the topic recreated
// between the claim's comparison and the fetch) is not applied: the worker compares the topic
// again, which holds the partition (the identity stored with the fences is the incarnation
// the claim compared), until the operator resets it; then every record is applied once.
// (Mutant BatchTopicIDUnchecked: the batch is applied under the claim of the other
// incarnation.)
func TestBatchOfAnotherTopicIDNotApplied(t *testing.T) {
	c, brokers := fakeCluster(t, kfake.SeedTopics(1, "orders"))
	const keys, n = 2, 5
	produce(t, brokers, "orders", keys, n)
	now := brokerTopic(t, brokers, "orders")

	// The Metadata answer as the broker gives it, and the other incarnation's ID.
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	mreq := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr("orders")
	mreq.Topics = append(mreq.Topics, mt)
	real, err := mreq.RequestWith(context.Background(), cl)
	cl.Close()
	if err != nil || len(real.Topics) != 1 {
		t.Fatalf("metadata of orders: %+v, %v", real, err)
	}
	other := [16]byte{0xba, 0x70, 0x4e}
	otherTopic := fence.Topic{ID: base64.RawURLEncoding.EncodeToString(other[:]), Partitions: 1}
	if otherTopic.ID == now.ID {
		t.Fatal("the other incarnation's ID is the broker's")
	}

	store := &staleTopicView{Store: newStore(t)}
	c.ControlKey(int16(kmsg.Metadata), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		r := req.(*kmsg.MetadataRequest)
		if !store.lie.Load() || len(r.Topics) != 1 || r.Topics[0].Topic == nil || *r.Topics[0].Topic != "orders" {
			return nil, nil, false
		}
		resp := *real
		resp.Topics = []kmsg.MetadataResponseTopic{real.Topics[0]}
		resp.Topics[0].TopicID = other
		resp.SetVersion(req.GetVersion())
		return &resp, nil, true
	})

	m := newMeter()
	f := newFolder()
	cons, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](store), nil, consumer.PerPartition(f.factory), consumer.Kafka(fastKafka(brokers)...),
		consumer.Logger(quiet), consumer.MeterProvider(m), consumer.RetryBackoff(10*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, cons)
	waitFor(t, "the batch of the other topic ID held (or applied)", bound(30*time.Second), func() bool {
		return m.sum(t, "baton.consumer.topic_refusals") >= 1 || m.sum(t, "baton.consumer.records.applied") > 0
	})
	if got, _ := store.TopicHistory(context.Background(), "g", "orders"); len(got) == 0 || got[0].Identity != otherTopic {
		t.Fatalf("topic history %+v: want the claim to have compared (and stored) the other incarnation %s", got, otherTopic.ID)
	}
	time.Sleep(300 * time.Millisecond) // several looks at the topic: still held
	if a := m.sum(t, "baton.consumer.records.applied"); a > 0 {
		t.Fatalf("%d records fetched from topic ID %s applied under a claim that compared %s", a, now.ID, otherTopic.ID)
	}
	if err := store.ResetTopic(context.Background(), "g", "orders", otherTopic, now, "test: topic recreated"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every record applied after the reset", bound(30*time.Second), allApplied(store.Store, keys, n))
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	checkFold(t, store.Store, keys, n)
	if v := f.Violations(); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
}

// Records deleted before they were applied in an era Baton moved with no position yet (after a
// topic reset, say) are losses too. The claim seeks to 0; the log starts at 6, so the first
// batch starts there and offsets 0..5 were never applied. The loss check must expect the offset
// the claim sought to: with "no position" read as "nothing expected", the six records vanish
// with no ERROR and records.lost stays 0. (Mutant LossUncheckedWithoutPosition.)
func TestDeletedRecordsReportedAsLossInAMovedEra(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	produce(t, brokers, "orders", 1, 10) // offsets 0..9
	store := newStore(t)
	ctx := context.Background()
	k := fence.Key{Group: "g", Topic: "orders", Partition: 0}
	if _, err := store.Claim(ctx, k, fence.Token{}, "old-owner"); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Recover(ctx, k, fence.Token{}, 0, "operator", "topic reset"); err != nil { // era 1, no position
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	dr, err := kadm.NewClient(cl).DeleteRecords(ctx, kadm.Offsets{"orders": {0: {At: 6}}})
	cl.Close()
	if err != nil || dr.Error() != nil {
		t.Fatalf("delete records: %v %v", err, dr.Error())
	}
	m := newMeter()
	c, err := consumer.New("g", []string{"orders"}, store, nil, consumer.PerPartition(consumer.Factory[*memfence.Tx](func(context.Context, fence.Key, fence.Token) (consumer.Handler[*memfence.Tx], error) {
		return consumer.Handler[*memfence.Tx](func(context.Context, *memfence.Tx, *consumer.Batch) error { return nil }), nil
	})), consumer.Kafka(fastKafka(brokers)...), consumer.Logger(quiet), consumer.MeterProvider(m))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	waitFor(t, "the records left applied", 30*time.Second, func() bool {
		st, _ := store.Load(ctx, k)
		return st.Position == 9
	})
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	if st, _ := store.Load(ctx, k); st.Token.Era != 1 {
		t.Fatalf("stored token %s, want era 1 (the test needs the moved era's seek to 0)", st.Token)
	}
	if got := m.sum(t, "baton.consumer.records.lost"); got != 6 {
		t.Fatalf("records lost counted %d, want 6 (offsets 0..5 deleted before they were applied, below the claim's seek to 0)", got)
	}
}
