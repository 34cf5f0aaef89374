package testenv_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/batonhq/baton/internal/testkit/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRealKafkaGroup proves the real broker works end to end for what Baton needs: produce,
// consume through a consumer group, and read the group generation at assignment, which must be
// positive and must grow when a second member joins and takes partitions.
func TestRealKafkaGroup(t *testing.T) {
	t.Parallel()
	brokers := testenv.KafkaBrokers(t)
	groupGeneration(t, brokers)
}

// TestFakeKafkaGroup runs the same scenario against kfake, so the unit-test fake and the real
// broker are held to one behaviour.
func TestFakeKafkaGroup(t *testing.T) {
	t.Parallel()
	groupGeneration(t, testenv.FakeKafka(t))
}

func groupGeneration(t *testing.T, brokers []string) {
	ctx := testenv.Context(t, 90*time.Second)
	topic := testenv.NewTopic(t, brokers, 4)
	group := testenv.UniqueName("g")

	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	const n = 100
	for i := 0; i < n; i++ {
		r := &kgo.Record{Topic: topic, Key: []byte(fmt.Sprintf("k%d", i%10)), Value: []byte(fmt.Sprint(i))}
		if err := prod.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}

	assigned := make(chan int32, 8)
	member := func() *kgo.Client {
		var cl *kgo.Client
		cl, err = kgo.NewClient(
			kgo.SeedBrokers(brokers...),
			kgo.ConsumerGroup(group),
			kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.FetchMaxWait(200*time.Millisecond),
			kgo.Balancers(kgo.CooperativeStickyBalancer()),
			kgo.OnPartitionsAssigned(func(_ context.Context, c *kgo.Client, m map[string][]int32) {
				if len(m[topic]) > 0 {
					_, gen := c.GroupMetadata()
					assigned <- gen
				}
			}),
		)
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	first := member()
	defer first.Close()
	got := 0
	for got < n {
		fs := first.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d records: %v", got, n, err)
		}
		fs.EachError(func(tp string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", tp, p, err) })
		got += fs.NumRecords()
	}
	gen1 := <-assigned
	if gen1 < 1 {
		t.Fatalf("first assignment generation %d, want >= 1", gen1)
	}

	// A second member joins: cooperative rebalancing gives it partitions at a later generation.
	second := member()
	defer second.Close()
	var gen2 int32
	deadline := time.After(60 * time.Second)
	for gen2 <= gen1 {
		pollCtx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		first.PollFetches(pollCtx)
		second.PollFetches(pollCtx)
		cancel()
		select {
		case g := <-assigned:
			if g > gen2 {
				gen2 = g
			}
		case <-deadline:
			t.Fatalf("no assignment after a second member joined (first at generation %d)", gen1)
		default:
		}
	}
	adm := kadm.NewClient(first)
	groups, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		t.Fatalf("describe group: %v", err)
	}
	if g := groups[group]; g.State != "Stable" && g.State != "CompletingRebalance" && g.State != "PreparingRebalance" {
		t.Fatalf("group %s state %q", group, g.State)
	}
	t.Logf("generation %d at first assignment, %d after a second member joined", gen1, gen2)
}

// TestRealPostgres proves the real database works for what Baton needs: a per-test schema, a
// transaction, and a conditional write whose zero-rows result is observable.
func TestRealPostgres(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.Postgres(t)
	ctx := testenv.Context(t, 30*time.Second)
	var sp string
	if err := pool.QueryRow(ctx, "SELECT current_schema()").Scan(&sp); err != nil {
		t.Fatal(err)
	}
	if sp != schema {
		t.Fatalf("current_schema %q, want the test's own schema %q", sp, schema)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE f (id int PRIMARY KEY, token bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO f VALUES (1, 5)"); err != nil {
		t.Fatal(err)
	}
	tag, err := pool.Exec(ctx, "UPDATE f SET token = $1 WHERE id = 1 AND token <= $1", 4)
	if err != nil {
		t.Fatal(err)
	}
	if tag.RowsAffected() != 0 {
		t.Fatalf("a lower token updated %d rows", tag.RowsAffected())
	}
	tag, err = pool.Exec(ctx, "UPDATE f SET token = $1 WHERE id = 1 AND token <= $1", 6)
	if err != nil {
		t.Fatal(err)
	}
	if tag.RowsAffected() != 1 {
		t.Fatalf("a higher token updated %d rows, want 1", tag.RowsAffected())
	}
}
