package partition_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/batonhq/baton/partition"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A partition worker runs one fetched batch over 4 lanes: records of one key run in order on
// one lane, different keys in parallel, and the result says how far the worker may advance its
// fence (under the token it captured at assignment: lanes never decide who may write).
func ExampleLanes_Run() {
	lanes, err := partition.NewLanes(partition.LaneCount(4))
	if err != nil {
		panic(err)
	}
	var batch []*kgo.Record
	for i, k := range []string{"alice", "bob", "alice", "carol", "bob", "alice"} {
		batch = append(batch, &kgo.Record{Topic: "orders", Partition: 3, Offset: int64(40 + i), Key: []byte(k)})
	}

	var mu sync.Mutex
	seen := map[string][]int64{}
	committable, err := lanes.Run(context.Background(), batch, func(ctx context.Context, r *kgo.Record) error {
		mu.Lock()
		defer mu.Unlock()
		seen[string(r.Key)] = append(seen[string(r.Key)], r.Offset)
		return nil
	})
	if err != nil {
		panic(err)
	}
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Println(k, seen[k])
	}
	fmt.Println("advance", partition.Of(batch[0]), "to", committable)
	// Output:
	// alice [40 42 45]
	// bob [41 44]
	// carol [43]
	// advance orders/3 to 45
}

// The partitioner goes into the producer's options; every producer of the topic must use it.
// Growing the topic from 12 to 16 partitions moves about a quarter of the keys.
func ExampleConsistentPartitioner() {
	p, err := partition.ConsistentPartitioner()
	if err != nil {
		panic(err)
	}
	// Pass these to kgo.NewClient.
	opts := []kgo.Opt{kgo.SeedBrokers("127.0.0.1:9092"), kgo.RecordPartitioner(p)}
	_ = opts

	var lines []string
	for _, k := range []string{"user-7", "user-42", "user-99"} {
		lines = append(lines, fmt.Sprintf("%s: %d of 12, %d of 16", k, p.PartitionKey([]byte(k), 12), p.PartitionKey([]byte(k), 16)))
	}
	fmt.Println(strings.Join(lines, "\n"))
	// Output:
	// user-7: 6 of 12, 6 of 16
	// user-42: 5 of 12, 5 of 16
	// user-99: 3 of 12, 14 of 16
}
