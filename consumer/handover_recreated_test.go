package consumer_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A recreated group of static members is a handover: a group of static members
// whose generation never moved (one static member, or members that joined in one rebalance:
// generation 1 on kfake and on the real broker, where TestRealStaticMemberReplacedIsAHandover
// sees 0.1 -> 3.1) is deleted (offsets.retention.minutes after it was left empty, the routine
// regression of consumer/doc.go) and recreated: its first join comes back at the very
// generation stored, and the partition goes to the same group.instance.id. This is the common
// case for a static group, not a coincidence of "climbing back" to a generation: it is
// reported as a handover (INFO, no regression, no ERROR) and RecoverRegressions(false) does not
// stop it. Safe (the proof and the era move are the same); this test pins what DESIGN.md's
// not-covered entry now says, so a change of the classification is a conscious one.
func TestRecreatedStaticGroupIsAHandover(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	produce(t, brokers, "orders", 2, 3)
	store := newStore(t)
	ctx := context.Background()
	key := fence.Key{Group: "g", Topic: "orders", Partition: 0}
	old := fence.Token{Era: 0, Epoch: 1} // the previous incarnation's first generation
	if _, err := store.Claim(ctx, key, old, "static:inst-a/0123456789abcdef/inst-a-of-the-deleted-group"); err != nil {
		t.Fatal(err)
	}
	m := newMeter()
	logs := &logRecorder{}
	c, err := consumer.New("g", []string{"orders"}, store, nil, consumer.PerPartition(newFolder().factory),
		consumer.Kafka(append(fastKafka(brokers), kgo.InstanceID("inst-a"))...),
		consumer.Logger(slog.New(logs)), consumer.MeterProvider(m), consumer.RecoverRegressions(false))
	if err != nil {
		t.Fatal(err)
	}
	r := start(t, c)
	waitFor(t, "a handover or a regression", 30*time.Second, func() bool {
		return m.sum(t, "baton.consumer.regressions") >= 1 || m.sum(t, "baton.consumer.handovers") >= 1
	})
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	st, _ := store.Load(ctx, key)
	if h, g := m.sum(t, "baton.consumer.handovers"), m.sum(t, "baton.consumer.regressions"); h != 1 || g != 0 || len(logs.logged()) != 0 || st.Token != (fence.Token{Era: 1, Epoch: 1}) {
		t.Errorf("recreated static group at the stored generation: handovers %d, regressions %d, ERROR %q, fence %s; want the documented handover (1, 0, none, 1.1)", h, g, logs.logged(), st.Token)
	}
}
