package ring_test

import (
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/partition/ring"
)

// The partitioner goes into the producer's options; every producer of the topic must use it.
// Growing the topic from 12 to 16 partitions moves about a quarter of the keys.
func ExampleNewPartitioner() {
	p, err := ring.NewPartitioner()
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
