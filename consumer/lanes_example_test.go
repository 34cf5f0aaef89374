package consumer_test

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/memfence"
)

// gateway is a handler in two stages: Prepare asks a (simulated) device gateway for each
// reading's calibrated value, in the partition's lanes and outside any transaction; Handle
// writes the results in the fenced transaction, in offset order.
type gateway struct{ applied chan int }

// Prepare is a read (safe to repeat, and harmless from a member that lost the partition):
// effects that must happen once would be appended to the outbox in Handle.
func (g gateway) Prepare(ctx context.Context, r *kgo.Record) (any, error) {
	select {
	case <-time.After(5 * time.Millisecond): // the remote call
		return strings.ToUpper(string(r.Value)), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (g gateway) Handle(_ context.Context, tx *memfence.Tx, b *consumer.Batch) error {
	for i, r := range b.Records {
		if err := tx.Put("twin/"+string(r.Key), []byte(b.Prepared[i].(string))); err != nil {
			return err
		}
	}
	g.applied <- len(b.Records)
	return nil
}

// With consumer.Lanes, a handler that implements consumer.Preparer has its slow part run for
// up to 8 records of a partition at once (one key's records one after another, in order),
// while the partition's goroutine stays its only writer.
func ExampleLanes() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "readings"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		panic(err)
	}
	defer prod.Close()
	for _, rd := range [][2]string{{"d1", "low"}, {"d2", "ok"}, {"d1", "ok"}, {"d3", "high"}} {
		prod.ProduceSync(context.Background(), &kgo.Record{Topic: "readings", Key: []byte(rd[0]), Value: []byte(rd[1])})
	}

	store, err := memfence.New()
	if err != nil {
		panic(err)
	}
	g := gateway{applied: make(chan int, 16)}
	c, err := consumer.New("twins", []string{"readings"}, fence.Sink[*memfence.Tx](store),
		func(context.Context, fence.Key, fence.Token) (consumer.Handler[*memfence.Tx], error) { return g, nil },
		consumer.Lanes(8),
		consumer.Kafka(kgo.SeedBrokers(brokers...), kgo.FetchMaxWait(100*time.Millisecond),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())),
		consumer.Logger(quiet))
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	for n := 0; n < 4; n += <-g.applied {
	}
	cancel()
	fmt.Println("Run:", <-done)
	for _, dev := range []string{"d1", "d2", "d3"} {
		v, _ := store.Get("twin/" + dev)
		fmt.Println(dev, string(v))
	}
	// Output:
	// Run: <nil>
	// d1 OK
	// d2 OK
	// d3 HIGH
}
