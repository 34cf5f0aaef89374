package ring

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/buraksezer/consistent"
	"github.com/twmb/franz-go/pkg/kgo"
)

func newPartitioner(t testing.TB, opts ...Option) *Partitioner {
	t.Helper()
	p, err := NewPartitioner(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// murmur2Partition is franz-go's (and Kafka's) default partition for a keyed record.
func murmur2Partition(tp kgo.TopicPartitioner, key []byte, n int) int {
	return tp.Partition(&kgo.Record{Key: key}, n)
}

// moved counts the keys whose partition differs between from and to partitions.
func moved(keys [][]byte, from, to int, part func(key []byte, n int) int) (moves, toNew int) {
	for _, k := range keys {
		a, b := part(k, from), part(k, to)
		if a != b {
			moves++
			if b >= from {
				toNew++
			}
		}
	}
	return moves, toNew
}

// TestGrowthMovesFewKeys is the measurement behind the partitioner: 100k random keys, a topic
// grown from 12 to 16 partitions. The ideal is (16-12)/16 = 25% (only what the new partitions
// take over). murmur2 % n keeps a key only if h%12 == h%16, true for 12 of every 48 hash
// values, so it moves 75%.
func TestGrowthMovesFewKeys(t *testing.T) {
	keys := randomKeys(100000, 1)
	p := newPartitioner(t)
	ours, oursToNew := moved(keys, 12, 16, p.PartitionKey)
	def := kgo.StickyKeyPartitioner(nil).ForTopic("t")
	theirs, _ := moved(keys, 12, 16, func(k []byte, n int) int { return murmur2Partition(def, k, n) })

	fo, ft := float64(ours)/float64(len(keys)), float64(theirs)/float64(len(keys))
	t.Logf("12->16 partitions, %d keys: consistent moved %d (%.1f%%; %.1f%% of them to a new partition), murmur2 moved %d (%.1f%%)",
		len(keys), ours, 100*fo, 100*float64(oursToNew)/float64(ours), theirs, 100*ft)
	for _, c := range []struct {
		name string
		part func([]byte, int) int
	}{{"consistent", p.PartitionKey}, {"murmur2", func(k []byte, n int) int { return murmur2Partition(def, k, n) }}} {
		load := make([]int, 16)
		for _, k := range keys {
			load[c.part(k, 16)]++
		}
		avg := float64(len(keys)) / 16
		t.Logf("%s balance at 16 partitions: max/avg %.3f min/avg %.3f", c.name, float64(slices.Max(load))/avg, float64(slices.Min(load))/avg)
	}
	if fo >= 0.30 {
		t.Errorf("consistent partitioner moved %.1f%% of keys, want < 30%%", 100*fo)
	}
	if ft < 0.74 || ft > 0.76 {
		t.Errorf("murmur2 moved %.1f%% of keys, theory says 75%% (sampling error ~0.14%%)", 100*ft)
	}
	// The ring must mostly move keys onto the new partitions, not shuffle the old ones.
	if float64(oursToNew)/float64(ours) < 0.9 {
		t.Errorf("only %d of %d moved keys went to a new partition", oursToNew, ours)
	}
}

// TestGrowthSweep reports movement and balance for other growth steps, including the jump-hash
// range above maxPartitions; it asserts only that movement stays near the ideal.
func TestGrowthSweep(t *testing.T) {
	keys := randomKeys(100000, 2)
	p := newPartitioner(t)
	for _, c := range [][2]int{{1, 2}, {3, 4}, {6, 8}, {12, 16}, {30, 32}, {50, 64}, {100, 128}, {200, 256}, {256, 257}, {500, 512}, {1000, 1024}} {
		from, to := c[0], c[1]
		m, _ := moved(keys, from, to, p.PartitionKey)
		load := make([]int, to)
		for _, k := range keys {
			load[p.PartitionKey(k, to)]++
		}
		avg := float64(len(keys)) / float64(to)
		hi, lo := 0, len(keys)
		for _, n := range load {
			hi, lo = max(hi, n), min(lo, n)
		}
		got, ideal := float64(m)/float64(len(keys)), float64(to-from)/float64(to)
		t.Logf("%4d->%4d moved %5.1f%% (ideal %5.1f%%)  at %d: max/avg %.3f min/avg %.3f", from, to, 100*got, 100*ideal, to, float64(hi)/avg, float64(lo)/avg)
		if from != maxPartitions && got > ideal+0.07 {
			t.Errorf("%d->%d moved %.1f%%, ideal %.1f%%", from, to, 100*got, 100*ideal)
		}
	}
}

// TestPartitionerIsTheRing checks that the cached table routes exactly like the consistent
// module's own LocateKey on a ring built independently here.
func TestPartitionerIsTheRing(t *testing.T) {
	const n = 12
	ms := make([]consistent.Member, n)
	for i := range ms {
		ms[i] = member(i)
	}
	ring := consistent.New(ms, consistent.Config{Hasher: hasher{}, PartitionCount: defaultSlots, ReplicationFactor: replicas, Load: load})
	p := newPartitioner(t)
	for _, k := range randomKeys(20000, 4) {
		want := int(ring.LocateKey(k).(member))
		if got := p.PartitionKey(k, n); got != want {
			t.Fatalf("key %q: partition %d, ring says %d", k, got, want)
		}
	}
}

// TestMemberNamesDoNotCollide: consistent places member m's points at hash(m.String()+replica);
// without a separator member "1" replica 10 and member "11" replica 0 would share a point.
func TestMemberNamesDoNotCollide(t *testing.T) {
	seen := map[string]string{}
	for m := range maxPartitions {
		for r := range replicas {
			point := member(m).String() + strconv.Itoa(r)
			if prev, ok := seen[point]; ok {
				t.Fatalf("ring point %q of member %d replica %d is also %s", point, m, r, prev)
			}
			seen[point] = fmt.Sprintf("member %d replica %d", m, r)
		}
	}
}

// TestPartitionerGolden pins the routing function. If it fails, keys are routed differently
// than by earlier releases: producers of different versions would split a key's records
// across partitions. Change the expectations only with a documented migration.
func TestPartitionerGolden(t *testing.T) {
	p := newPartitioner(t)
	got := map[int][]int{}
	for _, n := range []int{1, 12, 16, 256, 1000} {
		for _, k := range []string{"", "a", "user-42", "order:7f3a"} {
			got[n] = append(got[n], p.PartitionKey([]byte(k), n))
		}
	}
	want := map[int][]int{1: {0, 0, 0, 0}, 12: {0, 11, 5, 6}, 16: {10, 13, 5, 6}, 256: {177, 192, 32, 78}, 1000: {332, 894, 93, 962}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("routing changed:\n got %v\nwant %v", got, want)
	}
}

func TestTopicPartitioner(t *testing.T) {
	p := newPartitioner(t)
	tp := p.ForTopic("orders")
	keyed := &kgo.Record{Key: []byte("user-42")}
	empty := &kgo.Record{Key: []byte{}} // an empty key is a key, as in Kafka
	if !tp.RequiresConsistency(keyed) || !tp.RequiresConsistency(empty) {
		t.Fatal("a keyed record must require consistency (wait for its partition)")
	}
	for _, n := range []int{12, 16, 12, 300} { // the cached table follows n
		if got, want := tp.Partition(keyed, n), p.PartitionKey(keyed.Key, n); got != want {
			t.Fatalf("n=%d: Partition %d, PartitionKey %d", n, got, want)
		}
		if got, want := tp.Partition(empty, n), p.PartitionKey(nil, n); got != want {
			t.Fatalf("n=%d: empty key: Partition %d, want %d", n, got, want)
		}
	}
	if got := tp.Partition(keyed, 0); got != -1 {
		t.Fatalf("n=0: Partition %d, want -1", got)
	}

	unkeyed := &kgo.Record{}
	if tp.RequiresConsistency(unkeyed) {
		t.Fatal("a record without a key may go to any writable partition")
	}
	first := tp.Partition(unkeyed, 16)
	for range 100 {
		if got := tp.Partition(unkeyed, 16); got != first {
			t.Fatalf("unkeyed records left partition %d for %d before a new batch", first, got)
		}
	}
	tp.(kgo.TopicPartitionerOnNewBatch).OnNewBatch()
	if got := tp.Partition(unkeyed, 16); got == first || got < 0 || got >= 16 {
		t.Fatalf("after a new batch unkeyed records chose %d (was %d)", got, first)
	}
}

func TestPartitionerOptions(t *testing.T) {
	for _, n := range []int{0, -1, maxSlots + 1} {
		if _, err := NewPartitioner(Slots(n)); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("Slots(%d): %v, want ErrInvalid", n, err)
		}
	}
	// Every problem is reported, not just the first.
	_, err := NewPartitioner(Slots(0), nil, Slots(maxSlots+1))
	if !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("bad options: %v, want ErrInvalid", err)
	}
	for _, want := range []string{"slots 0", "option 1 is nil", fmt.Sprintf("slots %d", maxSlots+1)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("bad options: %q does not mention %q", err, want)
		}
	}
	// With fewer slots than partitions the ring cannot serve n; the jump hash does.
	small := newPartitioner(t, Slots(8))
	def := newPartitioner(t)
	for _, k := range randomKeys(1000, 6) {
		if a, b := small.PartitionKey(k, 9), jump(hasher{}.Sum64(k), 9); a != b {
			t.Fatalf("9 partitions over 8 slots: %d, want the jump hash's %d", a, b)
		}
		if a, b := def.PartitionKey(k, 12), small.PartitionKey(k, 8); a < 0 || a >= 12 || b < 0 || b >= 8 {
			t.Fatalf("out of range: %d of 12, %d of 8", a, b)
		}
	}
	if got := def.PartitionKey([]byte("k"), 0); got != -1 {
		t.Fatalf("PartitionKey(n=0) = %d, want -1", got)
	}
}

// TestPartitionerConcurrent: one Partitioner shared by many producers and topics (run with -race).
func TestPartitionerConcurrent(t *testing.T) {
	p := newPartitioner(t)
	keys := randomKeys(2000, 8)
	want := make([]int, len(keys))
	for i, k := range keys {
		want[i] = p.PartitionKey(k, 24)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			tp := p.ForTopic(fmt.Sprint("t", g))
			for i, k := range keys {
				n := 20 + (i+g)%8 // several partition counts, tables built concurrently
				got := tp.Partition(&kgo.Record{Key: k}, n)
				if n == 24 && got != want[i] {
					errs <- fmt.Errorf("goroutine %d key %d: %d, want %d", g, i, got, want[i])
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestPartitionerWithClient produces through a real franz-go client (against kfake) and checks
// that each keyed record landed where PartitionKey says.
func TestPartitionerWithClient(t *testing.T) {
	brokers := testenv.FakeKafka(t)
	topic := testenv.NewTopic(t, brokers, 12)
	p := newPartitioner(t)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(p), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var rs []*kgo.Record
	for i := range 200 {
		rs = append(rs, &kgo.Record{Key: fmt.Appendf(nil, "user-%d", i)})
	}
	rs = append(rs, &kgo.Record{Value: []byte("no key")})
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	for _, r := range rs[:200] {
		if want := p.PartitionKey(r.Key, 12); int(r.Partition) != want {
			t.Fatalf("key %s produced to %d, want %d", r.Key, r.Partition, want)
		}
	}
	if last := rs[200]; last.Partition < 0 || last.Partition >= 12 {
		t.Fatalf("unkeyed record in partition %d", last.Partition)
	}
}

func BenchmarkPartition(b *testing.B) {
	keys := randomKeys(4096, 9)
	recs := make([]*kgo.Record, len(keys))
	for i, k := range keys {
		recs[i] = &kgo.Record{Key: k}
	}
	p, err := NewPartitioner()
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		tp   kgo.TopicPartitioner
		n    int
	}{
		{"consistent/n=16", p.ForTopic("t"), 16},
		{"consistent-jump/n=1024", p.ForTopic("t"), 1024},
		{"murmur2-default/n=16", kgo.StickyKeyPartitioner(nil).ForTopic("t"), 16},
	} {
		b.Run(bc.name, func(b *testing.B) {
			bc.tp.Partition(recs[0], bc.n) // build the table outside the timing
			i := 0
			for b.Loop() {
				bc.tp.Partition(recs[i&4095], bc.n)
				i++
			}
		})
	}
}

func BenchmarkBuildTable(b *testing.B) {
	for _, n := range []int{16, 64, 256} {
		b.Run(fmt.Sprint("n=", n), func(b *testing.B) {
			for b.Loop() {
				if _, err := buildTable(n, defaultSlots); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
