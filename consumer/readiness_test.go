package consumer_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// gatedClaims holds every Claim until open is closed, as a slow or unreachable database would.
type gatedClaims struct {
	*memfence.Store
	open chan struct{}
}

func (g *gatedClaims) Claim(ctx context.Context, k fence.Key, t fence.Token, claimant string) (fence.State, error) {
	select {
	case <-g.open:
	case <-ctx.Done():
		return fence.State{}, ctx.Err()
	}
	return g.Store.Claim(ctx, k, t, claimant)
}

// poll calls Readiness from another goroutine until stopped, so that the race detector sees it
// run concurrently with Run, before it and after it.
func poll(c interface{ Readiness() consumer.Readiness }) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
				_ = c.Readiness().String()
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// Readiness means "joined and every assigned partition claimed": not running before Run; joined
// with partitions assigned but not claimed while the claims are held; ready once they complete;
// not running again after Run returned.
func TestReadinessJoinedAndClaimed(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(3, "t"))
	sink := &gatedClaims{Store: newStore(t), open: make(chan struct{})}
	c, err := consumer.New("g", []string{"t"}, sink, nil, consumer.PerPartition(newFolder().factory),
		consumer.Kafka(fastKafka(brokers)...), consumer.Logger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer poll(c)()
	if rd := c.Readiness(); rd.Ready() || rd.Running || rd.String() != "not running" {
		t.Fatalf("before Run: %+v (%s), want not running", rd, rd)
	}
	mb := start(t, c)
	waitFor(t, "the member to join with its partitions assigned", 10*time.Second, func() bool {
		rd := c.Readiness()
		return rd.Joined && rd.Assigned == 3
	})
	if rd := c.Readiness(); rd.Ready() || rd.Claimed != 0 || rd.String() != "claimed 0 of 3 assigned partitions" {
		t.Errorf("claims held: %+v (%s), want joined, 3 assigned, none claimed, not ready", rd, rd)
	}
	close(sink.open)
	waitFor(t, "the member to be ready", 10*time.Second, func() bool { return c.Readiness().Ready() })
	if rd := c.Readiness(); rd.Assigned != 3 || rd.Claimed != 3 || !strings.HasPrefix(rd.String(), "ready") {
		t.Errorf("ready: %+v (%s)", rd, rd)
	}
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	if rd := c.Readiness(); rd.Ready() || rd.Running {
		t.Errorf("after Run: %+v, want not running", rd)
	}
}

// A partition whose claim is refused stays assigned and unprocessed: the member is not ready.
func TestReadinessClaimRefused(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "t"))
	store := newStore(t)
	// A higher epoch already holds the fence, and regressions are not recovered: this member's
	// claim is refused and the partition waits, unprocessed, for the next rebalance.
	k := fence.Key{Group: "g", Topic: "t", Partition: 0}
	if _, err := store.Claim(context.Background(), k, fence.Token{Era: 0, Epoch: 1000}, "other"); err != nil {
		t.Fatal(err)
	}
	rec := &logRecorder{}
	c, err := consumer.New("g", []string{"t"}, store, nil, consumer.PerPartition(newFolder().factory), consumer.RecoverRegressions(false),
		consumer.Kafka(fastKafka(brokers)...), consumer.Logger(slog.New(rec)))
	if err != nil {
		t.Fatal(err)
	}
	start(t, c)
	waitFor(t, "the refusal to be logged", 10*time.Second, func() bool { return len(rec.logged()) > 0 })
	if rd := c.Readiness(); rd.Ready() || !rd.Joined || rd.Assigned != 1 || rd.Claimed != 0 {
		t.Errorf("claim refused: %+v (%s), want joined, 1 assigned, 0 claimed, not ready; logged %q", rd, rd, rec.logged())
	}
}

// A member with nothing assigned (more members than partitions) is ready once joined; a member
// whose broker went away loses its session and is not joined, naming the client's error.
func TestReadinessNoPartitionsAndLostSession(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"),
		kfake.BrokerConfigs(map[string]string{"group.min.session.timeout.ms": "500"}))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	newMember := func() *consumer.Consumer[*memfence.Tx] {
		c, err := consumer.New("g", []string{"t"}, newStore(t), nil, consumer.PerPartition(newFolder().factory),
			consumer.Kafka(fastKafka(brokers)...), consumer.Logger(quiet))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a, b := newMember(), newMember()
	defer poll(a)()
	start(t, a)
	waitFor(t, "a to be ready", 10*time.Second, func() bool { return a.Readiness().Ready() })
	start(t, b)
	waitFor(t, "both to be ready, one of them with no partition", 15*time.Second, func() bool {
		ra, rb := a.Readiness(), b.Readiness()
		return ra.Ready() && rb.Ready() && ra.Assigned+rb.Assigned == 1
	})
	cluster.Close()
	waitFor(t, "a to lose its session", 20*time.Second, func() bool { return !a.Readiness().Joined })
	rd := a.Readiness()
	if rd.Ready() || !rd.Running || !strings.HasPrefix(rd.String(), "not joined") {
		t.Errorf("after the broker went away: %+v (%s), want running, not joined", rd, rd)
	}
}

// On the real broker: the member becomes ready with every partition claimed.
func TestReadinessRealBroker(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.NewTopic(t, brokers, 3)
	c, err := consumer.New(testenv.UniqueName("ready"), []string{topic}, newStore(t), nil, consumer.PerPartition(newFolder().factory),
		consumer.Kafka(realKafka(brokers)...), consumer.Logger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer poll(c)()
	mb := start(t, c)
	waitFor(t, "the member to be ready on the real broker", 30*time.Second, func() bool { return c.Readiness().Ready() })
	if rd := c.Readiness(); rd.Assigned != 3 || rd.Claimed != 3 {
		t.Errorf("ready: %+v, want 3 assigned and claimed", rd)
	}
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	if c.Readiness().Running {
		t.Error("still running after Run returned")
	}
}
