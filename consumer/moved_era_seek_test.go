package consumer_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
)

// A fence Baton moved to a later era with no position (an operator's topic reset, a recovery)
// is read from the log's beginning, not from Kafka's committed offset: that offset may count
// another incarnation of the topic, and the records below it were never applied in this era.
// The group's committed offset here is 6 of a 10-record log; every record must be applied.
func TestMovedEraWithoutPositionReadsFromTheStart(t *testing.T) {
	_, brokers := fakeCluster(t, kfake.SeedTopics(1, "orders"))
	const n = 10
	produce(t, brokers, "orders", 1, n) // offsets 0..9, key k0's sequence 1..10
	ctx := context.Background()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var committed kadm.Offsets
	committed.AddOffset("orders", 0, 6, -1)
	if resp, err := kadm.NewClient(cl).CommitOffsets(ctx, "g", committed); err != nil || resp.Error() != nil {
		t.Fatalf("commit offset 6 for the group: %v, %v", err, resp.Error())
	}
	store := newStore(t)
	key := fence.Key{Group: "g", Topic: "orders", Partition: 0}
	moved, err := store.Recover(ctx, key, fence.Token{}, 0, "operator", "test: a reset of the topic")
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := store.Load(ctx, key); st.Position != fence.NoPosition || moved.Era == 0 {
		t.Fatalf("the moved fence: %+v, want a later era with no position", st)
	}
	f := newFolder()
	m := newMeter()
	c, err := consumer.New("g", []string{"orders"}, store, nil, consumer.PerPartition(f.factory), consumer.Kafka(fastKafka(brokers)...),
		consumer.Logger(quiet), consumer.MeterProvider(m))
	if err != nil {
		t.Fatal(err)
	}
	mc := start(t, c)
	waitFor(t, "the partition applied through its last offset", bound(30*time.Second), func() bool {
		st, _ := store.Load(ctx, key)
		return st.Position == n-1
	})
	_ = mc.stop()
	count, last := readState(store.Get("k/k0"))
	if count != n {
		t.Fatalf("applied %d of the %d records (key k0 at sequence %d): the claim in era %d with no position resumed at Kafka's committed offset 6, not at the log's start", count, n, last, moved.Era)
	}
	if v := f.Violations(); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
	if got := m.sum(t, "baton.consumer.records.applied"); got != n {
		t.Fatalf("records applied counted %d, want %s", got, strconv.Itoa(n))
	}
}
