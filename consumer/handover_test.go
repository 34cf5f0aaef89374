package consumer_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Static members: a static member (group.instance.id) restarted within the session
// timeout gets its partitions back at the same generation, without a rebalance (KIP-345:
// kfake's replaceStaticMember, like Kafka's, gives the new process a new member id and the old
// assignment). Its new workers present the very token the old ones claimed; the sink refuses
// an equal token held by another claimant, and the claimant is of this member's own identity,
// so it is a handover: proven with the coordinator, moved to a new era (which fences the old
// process's workers), INFO and baton.consumer.handovers, never an ERROR or a regression, and
// allowed with RecoverRegressions(false). Three replacements in a row: the generation (the
// token's epoch) never moves, proving no rebalance happened, and the era moves by exactly one
// per replacement. Fails on the code before the change (an ERROR "epoch regression" and a
// regression per partition and replacement; with RecoverRegressions(false) the partitions are
// left unprocessed) and with the mutant HandoverIsRegression.
func TestStaticMemberReplacedIsAHandover(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(2, "orders"))
	const keys, rounds, per = 4, 4, 3
	store := newStore(t)
	f := newFolder()
	m := newMeter()
	logs := &logRecorder{}
	var epoch int64 = -1
	for round := range rounds {
		produceSeq(t, brokers, "orders", keys, round*per+1, (round+1)*per)
		c, err := consumer.New("g", []string{"orders"}, store, nil, consumer.PerPartition(f.factory),
			consumer.Kafka(append(fastKafka(brokers), kgo.InstanceID("inst-a"))...),
			consumer.Logger(slog.New(logs)), consumer.MeterProvider(m), consumer.RecoverRegressions(false))
		if err != nil {
			t.Fatal(err)
		}
		r := start(t, c)
		applied := allApplied(store, keys, (round+1)*per)
		waitFor(t, "round's records applied (or a regression)", 30*time.Second, func() bool {
			return applied() || m.sum(t, "baton.consumer.regressions") > 0
		})
		if !applied() {
			t.Fatalf("round %d: %d regressions and the round's records not applied", round, m.sum(t, "baton.consumer.regressions"))
		}
		if err := r.stop(); err != nil { // a static member's close does not leave the group
			t.Fatalf("round %d: Run: %v", round, err)
		}
		for p := int32(0); p < 2; p++ {
			st, err := store.Load(context.Background(), fence.Key{Group: "g", Topic: "orders", Partition: p})
			if err != nil {
				t.Fatal(err)
			}
			if epoch < 0 {
				epoch = st.Token.Epoch
			}
			if st.Token.Epoch != epoch {
				t.Fatalf("round %d: partition %d at %s, first claimed at generation %d: a rebalance happened, the replacement this test is about did not", round, p, st.Token, epoch)
			}
			if st.Token.Era != int64(round) {
				t.Errorf("round %d: partition %d at era %d, want %d (one era per replacement)", round, p, st.Token.Era, round)
			}
		}
	}
	checkFold(t, store, keys, rounds*per)
	if v := f.Violations(); len(v) > 0 {
		t.Errorf("handler saw violations: %v", v)
	}
	if got := m.sum(t, "baton.consumer.handovers"); got != 2*(rounds-1) {
		t.Errorf("handovers counted %d, want %d (two partitions, %d replacements)", got, 2*(rounds-1), rounds-1)
	}
	if got := m.sum(t, "baton.consumer.regressions"); got != 0 {
		t.Errorf("regressions counted %d, want 0: a replaced static member is not a regression", got)
	}
	if got := m.sum(t, "baton.consumer.recoveries"); got != 0 {
		t.Errorf("regression recoveries counted %d, want 0", got)
	}
	if e := logs.logged(); len(e) > 0 {
		t.Errorf("logged at ERROR: %q", e)
	}
	recs, err := store.Recoveries(context.Background(), fence.Key{Group: "g", Topic: "orders", Partition: 0})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != rounds-1 || !strings.Contains(recs[0].Reason, "handover at generation") {
		t.Errorf("recorded recoveries %+v, want %d handovers", recs, rounds-1)
	}
}

// The claimant tells a handover from a regression, not the token: an equal token held by a
// claimant of ANOTHER identity (here another group.instance.id: a recreated group back at the
// stored generation, whose partition went to another member) is still a regression, ERROR and
// counted, and with RecoverRegressions(false) it is left to an operator. Fails when the
// identity comparison is dropped (every equal token taken for a handover).
func TestEqualTokenOfAnotherIdentityIsARegression(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	produce(t, brokers, "orders", 2, 3)
	store := newStore(t)
	ctx := context.Background()
	key := fence.Key{Group: "g", Topic: "orders", Partition: 0}
	old := fence.Token{Era: 0, Epoch: 1} // the generation kfake's first join gets
	if _, err := store.Claim(ctx, key, old, "static:inst-b/0123456789abcdef/inst-b-1"); err != nil {
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
	waitFor(t, "the regression reported", 30*time.Second, func() bool {
		return m.sum(t, "baton.consumer.regressions") >= 1 || m.sum(t, "baton.consumer.handovers") >= 1
	})
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if got := m.sum(t, "baton.consumer.handovers"); got != 0 {
		t.Errorf("handovers %d: an equal token held by another member's identity taken for a handover", got)
	}
	if len(logs.logged()) == 0 {
		t.Error("no ERROR for a regression at an equal token")
	}
	if st, _ := store.Load(ctx, key); st.Token != old {
		t.Errorf("fence moved to %s with RecoverRegressions off", st.Token)
	}
}

// A handover is still recovered only after the coordinator's proof: the previous claimant
// holds the very token the new worker presents, so a zombie of this member's identity (an old
// static process, frozen, that wakes up and claims after its successor) finds the same
// equal-token refusal and must not be able to take the partition back by calling it a
// handover. Here the fence holds the token of a claimant of this member's own identity while
// the coordinator's description says the partition is not this member's: the member must give
// up without recovering or writing. Mutant HandoverUnproven (no proof for the equal-token
// handover) recovers and writes.
func TestZombieOfTheSameIdentityNeverRecovers(t *testing.T) {
	c, brokers := fakeCluster(t, kfake.SeedTopics(1, "orders"))
	produce(t, brokers, "orders", 2, 3)
	store := newStore(t)
	ctx := context.Background()
	key := fence.Key{Group: "g", Topic: "orders", Partition: 0}
	held := fence.Token{Era: 0, Epoch: 1}
	const successor = "static:inst-a/0123456789abcdef/inst-a-successor"
	if _, err := store.Claim(ctx, key, held, successor); err != nil {
		t.Fatal(err)
	}
	var described atomic.Int32
	c.ControlKey(int16(kmsg.DescribeGroups), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		described.Add(1)
		r := req.(*kmsg.DescribeGroupsRequest)
		resp := r.ResponseKind().(*kmsg.DescribeGroupsResponse)
		for _, g := range r.Groups { // stable, and this member is not in it: not current
			sg := kmsg.NewDescribeGroupsResponseGroup()
			sg.Group, sg.State, sg.ProtocolType = g, "Stable", "consumer"
			resp.Groups = append(resp.Groups, sg)
		}
		return resp, nil, true
	})
	m := newMeter()
	z, err := consumer.New("g", []string{"orders"}, store, nil, consumer.PerPartition(newFolder().factory),
		consumer.Kafka(append(fastKafka(brokers), kgo.InstanceID("inst-a"))...),
		consumer.Logger(quiet), consumer.MeterProvider(m))
	if err != nil {
		t.Fatal(err)
	}
	r := start(t, z)
	waitFor(t, "Z gives up, recovers or writes", bound(30*time.Second), func() bool {
		return m.sum(t, "baton.consumer.stale_refusals") >= 1 || m.sum(t, "baton.consumer.handovers") >= 1 ||
			m.sum(t, "baton.consumer.records.applied") > 0
	})
	time.Sleep(300 * time.Millisecond) // a write, had one started, would land meanwhile
	_ = r.stop()
	if got := m.sum(t, "baton.consumer.claims.stale"); got < 1 {
		t.Fatalf("no stale claim: the equal-token refusal this test is about did not happen")
	}
	if recs, _ := store.Recoveries(ctx, key); len(recs) != 0 {
		t.Errorf("recovered %+v: a member the coordinator does not vouch for took the partition as a handover", recs)
	}
	if got := m.sum(t, "baton.consumer.records.applied"); got != 0 {
		t.Errorf("applied %d records", got)
	}
	if st, _ := store.Load(ctx, key); st.Token != held || st.Claimant != successor {
		t.Errorf("fence %s held by %q, want %s held by the successor", st.Token, st.Claimant, held)
	}
	if described.Load() == 0 {
		t.Errorf("the coordinator was never asked")
	}
}
