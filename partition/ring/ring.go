package ring

import (
	"fmt"
	"strconv"

	"github.com/buraksezer/consistent"
	"github.com/cespare/xxhash/v2"

	"github.com/batonhq/baton/fence"
)

// The ring's shape. Every value here is part of the routing function: changing any of them (or
// the hash, or the consistent module's version) re-routes keys, which for the partitioner
// breaks per-key order across the change. TestPartitionerGolden pins the result.
const (
	// replicas is the number of points each member has on the ring. 50 keeps the
	// member-to-slot split within the load bound without cascading much (see the report in
	// partitioner_test.go); the ring is built once per member count, so its cost is not on the
	// per-record path.
	replicas = 50

	// load is the bounded-loads factor: no member owns more than ceil(avg*ringLoad)
	// slots, avg = floor(slots/members).
	load = 1.1
)

// hasher is xxhash64 (seed 0). It is fixed, not seeded per process like hash/maphash, so a key
// hashes the same in every process and every release: the partitioner depends on that.
type hasher struct{}

func (hasher) Sum64(b []byte) uint64 { return xxhash.Sum64(b) }

// member is a ring member: a partition index.
type member int

// String is what the ring hashes to place the member's points: consistent hashes
// String()+strconv.Itoa(replica), so a separator is needed, or member "1" replica 10 and
// member "11" replica 0 would both be "110" and collide on the ring.
func (m member) String() string { return strconv.Itoa(int(m)) + ":" }

// buildTable returns slot -> member for members 0..n-1 over the given number of slots, computed by
// consistent hashing with bounded loads (50 ring points per member, no member owning more than
// 1.1x the average share of slots). The result depends only on n and slots. It fails with
// fence.ErrInvalid unless 1 <= n <= slots (the consistent module panics when a member's
// bounded share rounds to zero slots). Building costs time quadratic in n (see maxPartitions).
func buildTable(n, slots int) ([]int32, error) {
	if n < 1 || n > slots {
		return nil, fmt.Errorf("%w: %d members over %d slots (need 1 <= members <= slots)", fence.ErrInvalid, n, slots)
	}
	ms := make([]consistent.Member, n)
	for i := range ms {
		ms[i] = member(i)
	}
	c := consistent.New(ms, consistent.Config{
		Hasher:            hasher{},
		PartitionCount:    slots,
		ReplicationFactor: replicas,
		Load:              load,
	})
	table := make([]int32, slots)
	for s := range table {
		table[s] = int32(c.GetPartitionOwner(s).(member))
	}
	return table, nil
}
