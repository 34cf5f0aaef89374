package shard

import (
	"context"
	"testing"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
)

// memShard is an in-memory shard: memfence's sink and keyed fences, and topic identities it
// does not keep (the benchmark never claims through the consumer).
type memShard struct{ *memfence.Store }

func (memShard) SeeTopic(context.Context, string, string, fence.Topic, string) (fence.Topic, bool, error) {
	return fence.Topic{}, false, nil
}
func (memShard) ResetTopic(context.Context, string, string, fence.Topic, fence.Topic, string) error {
	return nil
}
func (memShard) TopicHistory(context.Context, string, string) ([]fence.TopicRecord, error) {
	return nil, nil
}

// memPlacements holds one placement in memory.
type memPlacements struct{ p Placement }

func (m *memPlacements) Migrate(context.Context) error                    { return nil }
func (m *memPlacements) Load(context.Context) (Placement, error)          { return m.p, nil }
func (m *memPlacements) Publish(context.Context, Placement, string) error { return nil }
func (m *memPlacements) History(context.Context) ([]Record, error) {
	return []Record{{Placement: m.p, Reason: "in memory"}}, nil
}

// BenchmarkApply compares one fenced batch (a claimed key, Apply, a write in the transaction)
// on an in-memory store directly and through a router over three such stores with 12 listed
// entries: what the router adds per batch (the placement lookup, the shard's mark on ctx)
// against a store that does almost nothing else, so the ratio bounds its cost over any real
// database from below. The two run alternately in one loop, each batch timed, so a busy
// machine slows both alike: it reports store-ns/batch, router-ns/batch and their ratio
// (store/router; 1 means free).
func BenchmarkApply(b *testing.B) {
	ctx := context.Background()
	k := fence.Key{Group: "bench-group", Topic: "telemetry", Partition: 7}
	tok := fence.Token{Epoch: 1}
	write := func(ctx context.Context, tx *memfence.Tx) error { return tx.Put("device-42", []byte("reading")) }
	newMem := func() memShard {
		s, err := memfence.New()
		if err != nil {
			b.Fatal(err)
		}
		return memShard{s}
	}
	shards := map[string]Shard[*memfence.Tx]{"a": newMem(), "b": newMem(), "c": newMem()}
	p := Placement{Version: 1, Shards: names3, Entries: map[fence.Key]string{}}
	for i := range int32(12) {
		p.Entries[fence.Key{Group: "other", Topic: "telemetry", Partition: i}] = names3[i%3]
	}
	r, err := New(ctx, "a", shards, &memPlacements{p})
	if err != nil {
		b.Fatal(err)
	}
	store := newMem()
	for _, s := range []fence.Sink[*memfence.Tx]{store, r} {
		if _, err := s.Claim(ctx, k, tok, "bench"); err != nil {
			b.Fatal(err)
		}
	}
	var inStore, inRouter time.Duration
	pos := int64(0)
	timed := func(s fence.Sink[*memfence.Tx], at int64) time.Duration {
		t0 := time.Now()
		if err := s.Apply(ctx, k, tok, at, at, write); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	for b.Loop() {
		// Which goes first alternates, so neither always pays for the other's garbage.
		if pos%2 == 0 {
			inStore += timed(store, pos)
			inRouter += timed(r, pos)
		} else {
			inRouter += timed(r, pos)
			inStore += timed(store, pos)
		}
		pos++
	}
	b.ReportMetric(float64(inStore.Nanoseconds())/float64(b.N), "store-ns/batch")
	b.ReportMetric(float64(inRouter.Nanoseconds())/float64(b.N), "router-ns/batch")
	b.ReportMetric(float64(inStore)/float64(inRouter), "ratio")
}

// BenchmarkRoute is the router's own work per batch, without a store: the placement lookup of
// a key and the shard's mark on ctx.
func BenchmarkRoute(b *testing.B) {
	ctx := context.Background()
	shards := map[string]Shard[*memfence.Tx]{}
	for _, n := range names3 {
		s, err := memfence.New()
		if err != nil {
			b.Fatal(err)
		}
		shards[n] = memShard{s}
	}
	p := Placement{Version: 1, Shards: names3, Entries: map[fence.Key]string{}}
	for i := range int32(12) {
		p.Entries[fence.Key{Group: "other", Topic: "telemetry", Partition: i}] = names3[i%3]
	}
	r, err := New(ctx, "a", shards, &memPlacements{p})
	if err != nil {
		b.Fatal(err)
	}
	rt := r.(*router[*memfence.Tx])
	k := fence.Key{Group: "bench-group", Topic: "telemetry", Partition: 7}
	b.ReportAllocs()
	var sink context.Context
	for b.Loop() {
		m, err := rt.member(*rt.cur.Load(), k)
		if err != nil {
			b.Fatal(err)
		}
		sink = context.WithValue(ctx, shardCtx{}, m)
	}
	_ = sink
}
