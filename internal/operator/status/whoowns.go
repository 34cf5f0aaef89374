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
	Shards      []string  `json:"shards,omitempty"`            // a sharded sink's databases, home first
	Placement   int64     `json:"placement_version,omitempty"` // the placement read (0: none)
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
	o := &Ownership{Key: key, Partitioner: partitioner, Partitions: n, Sources: snap.Sources, GroupState: snap.GroupState,
		Shards: snap.Shards, Placement: snap.Placement, Snapshot: snap}
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
	if err != nil || len(o.Shards) == 0 {
		return err
	}
	switch {
	case l.Shard == "":
		_, err = fmt.Fprintf(w, "shard unknown: the placement could not be read from the home shard %s\n", o.Shards[0])
	case o.Placement == 0:
		_, err = fmt.Fprintf(w, "shard %s holds its live fence (the placement could not be read from the home shard %s)\n", l.Shard, o.Shards[0])
	case l.Retired:
		_, err = fmt.Fprintf(w, "shard %s (placement version %d): its fence there is retired, a move is under way\n", l.Shard, o.Placement)
	default:
		_, err = fmt.Fprintf(w, "shard %s (placement version %d) holds its fence, state and outbox rows\n", l.Shard, o.Placement)
	}
	for _, e := range l.Elsewhere {
		if err == nil {
			state := "retired"
			if !e.Retired {
				state = "NOT retired, not an owner"
			}
			_, err = fmt.Fprintf(w, "also a fence on shard %s (token %s, position %d): %s\n", e.Shard, e.Token, e.Position, state)
		}
	}
	return err
}
