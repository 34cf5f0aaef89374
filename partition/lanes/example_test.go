package lanes_test

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/partition"
	"github.com/batonhq/baton/partition/lanes"
)

// A partition worker runs one fetched batch over 4 lanes: records of one key run in order on
// one lane, different keys in parallel, and the result says how far the worker may advance its
// fence (under the token it captured at assignment: lanes never decide who may write).
func ExampleLanes_Run() {
	l, err := lanes.New(lanes.Count(4))
	if err != nil {
		panic(err)
	}
	var batch []*kgo.Record
	for i, k := range []string{"alice", "bob", "alice", "carol", "bob", "alice"} {
		batch = append(batch, &kgo.Record{Topic: "orders", Partition: 3, Offset: int64(40 + i), Key: []byte(k)})
	}

	var mu sync.Mutex
	seen := map[string][]int64{}
	committable, err := l.Run(context.Background(), batch, func(ctx context.Context, r *kgo.Record) error {
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
