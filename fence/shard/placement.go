package shard

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/fencecheck"
)

// Placement maps every fence key to the shard that holds its fence, its state and its outbox
// rows. A key listed in Entries lives on the shard named there; any other key follows the
// default rule: the shards of Shards, in order, taken round-robin by partition from a start
// given by a hash (32-bit FNV-1a) of the group and topic, so the partitions of one topic are
// spread evenly and a partition added to a topic is placed with no operator step. The rule is
// fixed for the life of a placement's history (every version has the same Shards): changing it
// would move an unknown set of keys at once, so keys move one by one, as Entries.
//
// A Placement is a value: the router's is never modified in place, and Entries must not be
// modified after it is published.
type Placement struct {
	Version int64                // from 1, raised by one per published placement
	Shards  []string             // the default rule's shards, in order; never changes
	Entries map[fence.Key]string // keys placed explicitly, overriding the rule
}

// Shard returns the name of the shard k lives on under p.
func (p Placement) Shard(k fence.Key) string {
	if len(p.Entries) > 0 {
		if s, ok := p.Entries[k]; ok {
			return s
		}
	}
	if len(p.Shards) == 0 {
		return ""
	}
	h := uint32(2166136261)
	for i := 0; i < len(k.Group); i++ {
		h = (h ^ uint32(k.Group[i])) * 16777619
	}
	h *= 16777619 // the separator, a zero byte
	for i := 0; i < len(k.Topic); i++ {
		h = (h ^ uint32(k.Topic[i])) * 16777619
	}
	return p.Shards[(uint64(h)+uint64(uint32(k.Partition)))%uint64(len(p.Shards))]
}

// names returns every shard name p uses, sorted.
func (p Placement) names() []string {
	names := slices.Clone(p.Shards)
	for _, s := range p.Entries {
		names = append(names, s)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

func (p Placement) validate() error {
	if p.Version < 1 {
		return fmt.Errorf("%w: placement version %d, want 1 or more", fence.ErrInvalid, p.Version)
	}
	if len(p.Shards) == 0 {
		return fmt.Errorf("%w: placement %d has no shards for its default rule", fence.ErrInvalid, p.Version)
	}
	seen := map[string]bool{}
	for _, s := range p.Shards {
		if err := fencecheck.ValidateIdentifier("shard name", s); err != nil {
			return fmt.Errorf("placement %d: %w", p.Version, err)
		}
		if seen[s] {
			return fmt.Errorf("%w: placement %d names shard %q twice in its rule", fence.ErrInvalid, p.Version, s)
		}
		seen[s] = true
	}
	for k, s := range p.Entries {
		if err := fencecheck.ValidateKey(k); err != nil {
			return fmt.Errorf("placement %d: entry %s: %w", p.Version, k, err)
		}
		if err := fencecheck.ValidateIdentifier("shard name", s); err != nil {
			return fmt.Errorf("placement %d: entry %s: %w", p.Version, k, err)
		}
	}
	return nil
}

// doc is a placement's stored form, without its version (the row's key).
type doc struct {
	Shards  []string `json:"shards"`
	Entries []entry  `json:"entries"`
}

type entry struct {
	Group     string `json:"group"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Shard     string `json:"shard"`
}

func encode(p Placement) (string, error) {
	d := doc{Shards: p.Shards, Entries: make([]entry, 0, len(p.Entries))}
	for k, s := range p.Entries {
		d.Entries = append(d.Entries, entry{Group: k.Group, Topic: k.Topic, Partition: k.Partition, Shard: s})
	}
	slices.SortFunc(d.Entries, func(a, b entry) int {
		return cmp.Or(cmp.Compare(a.Group, b.Group), cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	b, err := json.Marshal(d)
	return string(b), err
}

func decode(version int64, s string) (Placement, error) {
	var d doc
	if err := json.Unmarshal([]byte(s), &d); err != nil {
		return Placement{}, fmt.Errorf("shard: placement %d: %w", version, err)
	}
	p := Placement{Version: version, Shards: d.Shards, Entries: make(map[fence.Key]string, len(d.Entries))}
	for _, e := range d.Entries {
		p.Entries[fence.Key{Group: e.Group, Topic: e.Topic, Partition: e.Partition}] = e.Shard
	}
	return p, p.validate()
}
