package status

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/partition/ring"
)

// Partitioners are the names WhoOwns accepts, with what produces records that way.
var Partitioners = map[string]string{
	"murmur2": "franz-go's and the Java client's default: murmur2 of the key",
	"ring":    "Baton's consistent-hash partitioner (partition/ring, default slots)",
	"sarama":  "Sarama's default hash partitioner: FNV-1a of the key",
}

// PartitionerNames lists the accepted partitioner names, sorted.
func PartitionerNames() []string {
	var out []string
	for n := range Partitioners {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Route returns the partition key goes to among n with the named partitioner.
func Route(partitioner string, topic string, key []byte, n int) (int32, error) {
	var p kgo.Partitioner
	switch partitioner {
	case "", "murmur2":
		p = kgo.StickyKeyPartitioner(nil)
	case "ring":
		rp, err := ring.NewPartitioner()
		if err != nil {
			return 0, err
		}
		p = rp
	case "sarama":
		p = kgo.StickyKeyPartitioner(kgo.SaramaCompatHasher(func(b []byte) uint32 {
			h := fnv.New32a()
			h.Write(b)
			return h.Sum32()
		}))
	default:
		return 0, errorf(ErrUsage, "unknown partitioner %q (known: %s)", partitioner, strings.Join(PartitionerNames(), ", "))
	}
	return int32(p.ForTopic(topic).Partition(&kgo.Record{Topic: topic, Key: key}, n)), nil
}

// Ownership is who-owns' answer.
type Ownership struct {
	Key         string    `json:"key"`
	Partitioner string    `json:"partitioner"`
	Partitions  int       `json:"partitions"`
	Line        Partition `json:"partition"`
	Sources     []Source  `json:"sources"`
	GroupState  string    `json:"group_state,omitempty"`
	Snapshot    *Snapshot `json:"-"`
}

// WhoOwns routes key on topic with the named partitioner and returns that partition's line.
// A topic the brokers do not know fails with [ErrNotFound] before anything else is read.
func (c *Collector) WhoOwns(ctx context.Context, topic, key, partitioner string) (*Ownership, error) {
	if partitioner == "" {
		partitioner = "murmur2"
	}
	if _, err := Route(partitioner, topic, nil, 1); err != nil {
		return nil, err
	}
	n, err := c.TopicPartitions(ctx, topic)
	if err != nil {
		return nil, err
	}
	p, err := Route(partitioner, topic, []byte(key), n)
	if err != nil {
		return nil, err
	}
	c.cfg.Topics = []string{topic}
	snap, err := c.Collect(ctx)
	o := &Ownership{Key: key, Partitioner: partitioner, Partitions: n, Sources: snap.Sources, GroupState: snap.GroupState, Snapshot: snap}
	if l := snap.Partition(topic, p); l != nil {
		o.Line = *l
	} else {
		o.Line = Partition{Topic: topic, Partition: p}
	}
	return o, err
}

// WriteOwnership writes who-owns' answer in a few lines.
func WriteOwnership(w interface{ Write([]byte) (int, error) }, o *Ownership) error {
	for _, src := range o.Sources {
		if src.Err != "" {
			fmt.Fprintf(w, "unreachable: %s (%s): %s\n", src.Name, src.Addr, src.Err)
		}
	}
	l := o.Line
	_, err := fmt.Fprintf(w, "key %q -> %s/%d (%s, %d partitions)\nowner %s, token %s, position %s, committed %s, high watermark %s, lag %s\n",
		o.Key, l.Topic, l.Partition, o.Partitioner, o.Partitions, l.Owner.String(), orDash(l.Token), num(l.Position), num(l.Committed), num(l.HighWatermark), num(l.Lag))
	return err
}
