package ring

import (
	"errors"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
)

// defaultSlots is the number of slots [NewPartitioner] hashes keys into unless [Slots]
// says otherwise. It is prime (the consistent module's advice).
const defaultSlots = 16381

// maxPartitions is the largest partition count routed by the consistent-hash ring; larger
// topics are routed by jump consistent hashing. The consistent module builds its ring in time
// quadratic in the member count (it re-sorts the ring for every member added): about 10 ms for
// 16 partitions, 25 ms for 64 and 0.2 s for 256 on a loaded 2-core machine, 5 s for 1000; the
// build runs once per partition count, on the first record produced to a topic of that count.
const maxPartitions = 256

// maxSlots bounds [Slots].
const maxSlots = 1 << 16

// Partitioner is a kgo.Partitioner that routes keyed records by consistent hashing, so that
// growing a topic from N to M partitions moves about (M-N)/M of the keys to another partition
// (the keys the new partitions take over), where Kafka's default murmur2(key) % n moves most of
// them (about 75% from 12 to 16). Records without a key are spread as
// kgo.StickyPartitioner spreads them.
//
// A key is hashed with xxhash64 into one of Slots slots (hash % slots); the slots are spread over
// partitions 0..n-1 by github.com/buraksezer/consistent (v0.10.0) with bounded loads (50 ring
// points per partition, no partition owning more than 1.1x the average share of slots). The
// slot table is built once per partition count and cached.
//
// The mapping must be identical in every producer of a topic, and in every consumer that
// predicts it: the hash, the slot count, the ring parameters and the consistent module's version
// are all part of it. Changing any of them re-routes keys, and records of a key produced before
// and after the change may then sit in different partitions, out of order. Growing a topic
// re-routes some keys too: that is inherent to adding partitions, consistent hashing only makes
// it the fewest. Routing never decides who may write: that is the consumer group's assignment
// and the fence's token.
//
// Partition counts above 256 (or above the slot count, since each partition
// needs a slot) are routed by jump consistent hashing (Lamping and Veach) over the same 64-bit
// hash instead, also deterministic and minimal-movement; a topic that grows across that limit is
// re-routed wholesale.
//
// A *Partitioner is safe for concurrent use by any number of clients.
type Partitioner struct {
	slots int

	mu     sync.Mutex
	tables map[int][]int32 // partition count -> slot -> partition; tables are never modified
}

var (
	_ kgo.Partitioner                = (*Partitioner)(nil)
	_ kgo.TopicPartitioner           = (*topicPartitioner)(nil)
	_ kgo.TopicPartitionerOnNewBatch = (*topicPartitioner)(nil)
)

// Option configures [NewPartitioner]. An invalid value makes NewPartitioner fail.
type Option func(*config) error

type config struct{ slots int }

// Slots sets the number of slots keys are hashed into: the granularity at which keys move
// between partitions, and the largest partition count the consistent ring serves. Default
// 16381 (a prime, as the consistent module advises); between 1 and 65536 (1<<16). More slots
// per partition move fewer keys than the ideal (M-N)/M when the bounded loads cascade, at 4
// bytes per slot per cached partition count. Changing it re-routes keys.
func Slots(n int) Option {
	return func(c *config) error {
		if n < 1 || n > maxSlots {
			return fmt.Errorf("%w: slots %d, want 1..%d", fence.ErrInvalid, n, maxSlots)
		}
		c.slots = n
		return nil
	}
}

// NewPartitioner returns a [Partitioner] configured by opts; use it with
// kgo.RecordPartitioner. It fails with fence.ErrInvalid if an option is nil or out of
// range, reporting every such option (errors.Join).
func NewPartitioner(opts ...Option) (*Partitioner, error) {
	cfg := config{slots: defaultSlots}
	var errs []error
	for i, o := range opts {
		if o == nil {
			errs = append(errs, fmt.Errorf("%w: option %d is nil", fence.ErrInvalid, i))
			continue
		}
		if err := o(&cfg); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Partitioner{slots: cfg.slots, tables: make(map[int][]int32)}, nil
}

// ForTopic implements kgo.Partitioner.
func (p *Partitioner) ForTopic(topic string) kgo.TopicPartitioner {
	return &topicPartitioner{p: p, sticky: kgo.StickyPartitioner().ForTopic(topic)}
}

// PartitionKey returns the partition, in [0, n), that key is routed to among n partitions; it
// is what the client computes for a record with that key. n must be positive, else it returns
// -1.
func (p *Partitioner) PartitionKey(key []byte, n int) int {
	if n <= 0 {
		return -1
	}
	return route(key, n, p.slots, p.table(n))
}

// route maps key among n partitions with table, the slot table for n (nil when n > slots).
func route(key []byte, n, slots int, table []int32) int {
	h := hasher{}.Sum64(key)
	if table == nil {
		return jump(h, n)
	}
	return int(table[h%uint64(slots)])
}

// table returns the cached slot table for n partitions, building it on first use; nil if n is
// routed by the jump hash instead.
func (p *Partitioner) table(n int) []int32 {
	if n > p.slots || n > maxPartitions {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.tables[n]
	if !ok {
		var err error
		if t, err = buildTable(n, p.slots); err != nil {
			// 1 <= n <= slots was checked; a failure here is a bug in buildTable
			// preconditions. Fall back to the jump hash rather than fail the record.
			return nil
		}
		p.tables[n] = t
	}
	return t
}

// topicPartitioner serves one topic. kgo calls it for one record at a time, so it caches the
// table of the last partition count without locking.
type topicPartitioner struct {
	p      *Partitioner
	sticky kgo.TopicPartitioner // for records without a key
	n      int
	table  []int32
}

// RequiresConsistency reports whether r has a key: a keyed record must go to its partition
// even if that partition is briefly unwritable (it waits and retries, keeping per-key order),
// while a record without a key may go to any writable partition.
func (t *topicPartitioner) RequiresConsistency(r *kgo.Record) bool { return r.Key != nil }

// Partition implements kgo.TopicPartitioner.
func (t *topicPartitioner) Partition(r *kgo.Record, n int) int {
	if r.Key == nil {
		return t.sticky.Partition(r, n)
	}
	if n <= 0 {
		return -1 // kgo never asks with no partitions; -1 makes it fail the record if it did
	}
	if n != t.n {
		t.n, t.table = n, t.p.table(n)
	}
	return route(r.Key, n, t.p.slots, t.table)
}

// OnNewBatch lets records without a key switch partition when a batch fills, as
// kgo.StickyPartitioner does.
func (t *topicPartitioner) OnNewBatch() {
	if nb, ok := t.sticky.(kgo.TopicPartitionerOnNewBatch); ok {
		nb.OnNewBatch()
	}
}

// jump is Lamping and Veach's jump consistent hash: a bucket in [0, n) for key such that
// growing n to n+1 moves only the keys that land in the new bucket.
func jump(key uint64, n int) int {
	var b, j int64 = -1, 0
	for j < int64(n) {
		b = j
		key = key*2862933555777941757 + 1
		j = int64(float64(b+1) * (float64(int64(1)<<31) / float64((key>>33)+1)))
	}
	return int(b)
}
