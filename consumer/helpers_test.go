package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
	"github.com/batonhq/baton/partition"
	"github.com/twmb/franz-go/pkg/kgo"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// fastKafka are client settings that make rebalances quick on kfake.
func fastKafka(brokers []string) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(brokers...),
		kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.SessionTimeout(3 * time.Second),
		kgo.RebalanceTimeout(3 * time.Second),
		kgo.HeartbeatInterval(200 * time.Millisecond),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.MetadataMinAge(100 * time.Millisecond),
	}
}

// produce writes n records per key over keys keys; a record's value is its per-key sequence
// number (1-based), so a key's state after applying all of them is count n, last n.
func produce(t testing.TB, brokers []string, topic string, keys, n int) {
	t.Helper()
	produceSeq(t, brokers, topic, keys, 1, n)
}

// produceSeq writes the records of sequence numbers from..to (inclusive) for every key.
func produceSeq(t testing.TB, brokers []string, topic string, keys, from, to int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic),
		kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	for s := from; s <= to; s++ {
		for k := 0; k < keys; k++ {
			wg.Add(1)
			cl.Produce(ctx, &kgo.Record{Key: []byte("k" + strconv.Itoa(k)), Value: []byte(strconv.Itoa(s))}, func(_ *kgo.Record, err error) {
				defer wg.Done()
				if err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatalf("produce: %v", firstErr)
	}
}

// folder is a handler factory for memfence: it folds each key's sequence numbers into
// "count,last" and records every violation (a gap, a repeat, a lower token by position).
type folder struct {
	mu         sync.Mutex
	violations []string
	attempts   map[string]int // partition -> Handle calls
	block      func(ctx context.Context, b *consumer.Batch) error
}

func newFolder() *folder { return &folder{attempts: map[string]int{}} }

func (f *folder) violate(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.violations = append(f.violations, fmt.Sprintf(format, args...))
}

func (f *folder) Violations() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.violations...)
}

func (f *folder) factory(ctx context.Context, k fence.Key, t fence.Token) (consumer.Handler[*memfence.Tx], error) {
	return consumer.Handler[*memfence.Tx](func(ctx context.Context, tx *memfence.Tx, b *consumer.Batch) error {
		f.mu.Lock()
		f.attempts[b.Key.String()]++
		f.mu.Unlock()
		if f.block != nil {
			if err := f.block(ctx, b); err != nil {
				return err
			}
		}
		// Tokens never go down along a partition's positions.
		tk := "token/" + b.Key.String()
		if v, ok := tx.Get(tk); ok {
			prev, err := fence.ParseToken(string(v))
			if err != nil {
				return err
			}
			if b.Token.Compare(prev) < 0 {
				f.violate("partition %s: token %s after %s", b.Key, b.Token, prev)
			}
		}
		if err := tx.Put(tk, []byte(b.Token.String())); err != nil {
			return err
		}
		for _, r := range b.Records {
			if partition.Of(r) != (partition.ID{Topic: b.Key.Topic, Partition: b.Key.Partition}) {
				f.violate("record of %s in batch of %s", partition.Of(r), b.Key)
			}
			seq, _ := strconv.Atoi(string(r.Value))
			count, last := readState(tx.Get("k/" + string(r.Key)))
			if seq != last+1 {
				f.violate("key %s: seq %d after %d (offset %d)", r.Key, seq, last, r.Offset)
			}
			if err := tx.Put("k/"+string(r.Key), []byte(fmt.Sprintf("%d,%d", count+1, seq))); err != nil {
				return err
			}
		}
		return nil
	}), nil
}

func readState(v []byte, ok bool) (count, last int) {
	if !ok {
		return 0, 0
	}
	c, l, _ := strings.Cut(string(v), ",")
	count, _ = strconv.Atoi(c)
	last, _ = strconv.Atoi(l)
	return count, last
}

// checkFold checks that every key's state is the fold of its n records: none lost, none
// applied twice.
func checkFold(t *testing.T, s *memfence.Store, keys, n int) {
	t.Helper()
	for k := 0; k < keys; k++ {
		count, last := readState(s.Get("k/k" + strconv.Itoa(k)))
		if count != n || last != n {
			t.Errorf("key k%d: count %d last %d, want %d %d", k, count, last, n, n)
		}
	}
}

// waitFor polls cond until it holds or the bound passes; the bound is a liveness guard, not
// an assertion on time.
func waitFor(t *testing.T, what string, bound time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func allApplied(s *memfence.Store, keys, n int) func() bool {
	return func() bool {
		for k := 0; k < keys; k++ {
			if c, _ := readState(s.Get("k/k" + strconv.Itoa(k))); c < n {
				return false
			}
		}
		return true
	}
}

// member runs a consumer until stop is called; stop waits for Run and returns its error.
type member struct {
	cancel context.CancelFunc
	done   chan error
}

func start[Tx any](t *testing.T, c *consumer.Consumer[Tx]) *member {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	m := &member{cancel: cancel, done: make(chan error, 1)}
	go func() { m.done <- c.Run(ctx) }()
	t.Cleanup(func() { m.stop() })
	return m
}

func (m *member) stop() error {
	m.cancel()
	err, ok := <-m.done
	if ok {
		close(m.done)
	}
	return err
}

// meter is an OpenTelemetry SDK meter provider with a manual reader, to read the consumer's
// counters in tests.
type meter struct {
	*sdkmetric.MeterProvider
	r *sdkmetric.ManualReader
}

func newMeter() *meter {
	r := sdkmetric.NewManualReader()
	return &meter{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(r)), r: r}
}

// sum returns the total of an Int64 counter over all attributes.
func (m *meter) sum(t testing.TB, name string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := m.r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if mt.Name != name {
				continue
			}
			if s, ok := mt.Data.(metricdata.Sum[int64]); ok {
				for _, dp := range s.DataPoints {
					total += dp.Value
				}
			}
		}
	}
	return total
}

var errTransient = errors.New("transient test failure")

// stagedHandler is a per-partition handler with a first stage for consumer.Lanes.
type stagedHandler[Tx any] interface {
	Handle(ctx context.Context, tx Tx, b *consumer.Batch) error
	Prepare(ctx context.Context, r *kgo.Record) (any, error)
}

// stages gives a stagedHandler to a consumer: perPartition builds one per partition and token,
// and lanes' prepare function calls the Prepare of the one built for the record's partition
// and token, so each keeps its state per partition and token.
type stages[Tx any, H stagedHandler[Tx]] struct {
	build func(context.Context, fence.Key, fence.Token) (H, error)
	mu    sync.Mutex
	built map[fence.Key]map[fence.Token]H
}

func newStages[Tx any, H stagedHandler[Tx]](build func(context.Context, fence.Key, fence.Token) (H, error)) *stages[Tx, H] {
	return &stages[Tx, H]{build: build, built: map[fence.Key]map[fence.Token]H{}}
}

func (s *stages[Tx, H]) perPartition() consumer.Option {
	return consumer.PerPartition(func(ctx context.Context, k fence.Key, t fence.Token) (consumer.Handler[Tx], error) {
		h, err := s.build(ctx, k, t)
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.built[k] == nil {
			s.built[k] = map[fence.Token]H{}
		}
		s.built[k][t] = h
		return h.Handle, nil
	})
}

func (s *stages[Tx, H]) lanes(n int) consumer.Option {
	return consumer.Lanes(n, func(ctx context.Context, k fence.Key, t fence.Token, r *kgo.Record) (any, error) {
		s.mu.Lock()
		h, ok := s.built[k][t]
		s.mu.Unlock()
		if !ok {
			return nil, fmt.Errorf("no handler built for %s at %s", k, t)
		}
		return h.Prepare(ctx, r)
	})
}
