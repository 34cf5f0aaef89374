package consumer_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A member whose Kafka options set no client id is named after its process ("baton-<host>-
// <pid>", not franz-go's "kgo" that every member shares), which is what the coordinator (and
// baton status, as client id @ address) shows as an owner; a client id the user sets is kept.
func TestMembersNamedAfterTheirProcess(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(2, "orders"))
	store := newStore(t)
	newMember := func(extra ...kgo.Opt) *consumer.Consumer[*memfence.Tx] {
		c, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](store), nil, consumer.PerPartition(newFolder().factory),
			consumer.Kafka(append(fastKafka(brokers), extra...)...), consumer.Logger(quiet))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a, b := newMember(), newMember(kgo.ClientID("mine"))
	start(t, a)
	start(t, b)
	waitFor(t, "both members assigned", 30*time.Second, func() bool {
		return a.Readiness().Assigned == 1 && b.Readiness().Assigned == 1
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	groups, err := kadm.NewClient(cl).DescribeGroups(context.Background(), "g")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range groups["g"].Members {
		ids = append(ids, m.ClientID)
	}
	if len(ids) != 2 {
		t.Fatalf("members %v, want 2", ids)
	}
	var named, mine bool
	for _, id := range ids {
		named = named || strings.HasPrefix(id, "baton-") && strings.Count(id, "-") >= 2
		mine = mine || id == "mine"
	}
	if !named || !mine {
		t.Fatalf("client ids %v: want one baton-<host>-<pid> and the user's own \"mine\"", ids)
	}
}
