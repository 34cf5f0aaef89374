package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

var quiet = func() *slog.Logger {
	if os.Getenv("BATON_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}()

func newStore(t *testing.T) *memfence.Store {
	t.Helper()
	s, err := memfence.New()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestNewRejectsMisconfiguration(t *testing.T) {
	s := newStore(t)
	f := newFolder().factory
	brokers := consumer.Kafka(kgo.SeedBrokers("127.0.0.1:1"))
	cases := []struct {
		name string
		make func() error
		want error
	}{
		{"empty group", func() error {
			_, err := consumer.New("", []string{"t"}, s, nil, consumer.PerPartition(f), brokers)
			return err
		}, consumer.ErrNoGroup},
		{"no topics", func() error { _, err := consumer.New("g", nil, s, nil, consumer.PerPartition(f), brokers); return err }, consumer.ErrNoTopics},
		{"empty topic", func() error {
			_, err := consumer.New("g", []string{""}, s, nil, consumer.PerPartition(f), brokers)
			return err
		}, consumer.ErrNoTopics},
		{"nil sink", func() error {
			_, err := consumer.New[*memfence.Tx]("g", []string{"t"}, nil, nil, consumer.PerPartition(f), brokers)
			return err
		}, consumer.ErrNilSink},
		{"nil factory", func() error { _, err := consumer.New("g", []string{"t"}, s, nil, brokers); return err }, consumer.ErrNilHandler},
		{"no brokers", func() error { _, err := consumer.New("g", []string{"t"}, s, nil, consumer.PerPartition(f)); return err }, consumer.ErrNoBrokers},
		{"bad inflight", func() error {
			_, err := consumer.New("g", []string{"t"}, s, nil, consumer.PerPartition(f), brokers, consumer.MaxInflightPerPartition(0))
			return err
		}, consumer.ErrInvalidOption},
		{"total below partition", func() error {
			_, err := consumer.New("g", []string{"t"}, s, nil, consumer.PerPartition(f), brokers, consumer.MaxInflight(10), consumer.MaxInflightPerPartition(20))
			return err
		}, consumer.ErrInvalidOption},
		{"bad backoff", func() error {
			_, err := consumer.New("g", []string{"t"}, s, nil, consumer.PerPartition(f), brokers, consumer.RetryBackoff(time.Second, time.Millisecond))
			return err
		}, consumer.ErrInvalidOption},
		{"nil logger", func() error {
			_, err := consumer.New("g", []string{"t"}, s, nil, consumer.PerPartition(f), brokers, consumer.Logger(nil))
			return err
		}, consumer.ErrInvalidOption},
		{"empty dlq", func() error {
			_, err := consumer.New("g", []string{"t"}, s, nil, consumer.PerPartition(f), brokers, consumer.DeadLetterTopic(""))
			return err
		}, consumer.ErrInvalidOption},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := c.make(); !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
		})
	}
	if _, err := consumer.New("g", []string{"t"}, s, nil, consumer.PerPartition(f), brokers); err != nil {
		t.Fatalf("valid config: %v", err)
	}
}

// A consumer applies every record exactly once, and resumes at the sink's position, not at
// Kafka's committed offset: records the sink already holds are not even fetched.
func TestResumesFromSinkPosition(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	const keys, n = 4, 10
	produce(t, brokers, "orders", keys, n)
	s := newStore(t)
	ctx := context.Background()
	key := fence.Key{Group: "g", Topic: "orders", Partition: 0}
	// A previous owner applied offsets 0..19 (the first 20 records) at token 0.0.
	if _, err := s.Claim(ctx, key, fence.Token{}, "test"); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(ctx, key, fence.Token{}, 19, 19, func(ctx context.Context, tx *memfence.Tx) error {
		for k := 0; k < keys; k++ {
			if err := tx.Put("k/k"+strconv.Itoa(k), []byte("5,5")); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	f := newFolder()
	m := newMeter()
	c, err := consumer.New("g", []string{"orders"}, s, nil, consumer.PerPartition(f.factory), consumer.Kafka(fastKafka(brokers)...),
		consumer.Logger(quiet), consumer.MeterProvider(m))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	waitFor(t, "all records applied", 30*time.Second, allApplied(s, keys, n))
	if err := mb.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	checkFold(t, s, keys, n)
	if v := f.Violations(); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
	if got := m.sum(t, "baton.consumer.records.duplicates_skipped"); got != 0 {
		t.Errorf("%d duplicates fetched: the consumer did not seek to the sink's position", got)
	}
	if got := m.sum(t, "baton.consumer.records.applied"); got != keys*n-20 {
		t.Errorf("applied %d records, want %d", got, keys*n-20)
	}
	st, err := s.Load(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if st.Position != keys*n-1 || st.Token.Epoch < 1 {
		t.Errorf("fence state %+v: want position %d and a claimed (non-zero) epoch", st, keys*n-1)
	}
}

// Members joining and leaving hand partitions over without losing or double-applying a record,
// and tokens never go down along a partition.
func TestRebalancesKeepExactlyOnce(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(6, "orders"))
	const keys, n = 24, 60
	s := newStore(t)
	f := newFolder()
	newMember := func(opts ...consumer.Option) *consumer.Consumer[*memfence.Tx] {
		c, err := consumer.New("g", []string{"orders"}, s, nil, append([]consumer.Option{consumer.PerPartition(f.factory), consumer.Kafka(fastKafka(brokers)...),
			consumer.Logger(quiet), consumer.MaxInflightPerPartition(20), consumer.MaxInflight(60)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a := start(t, newMember())
	done := make(chan struct{})
	go func() { defer close(done); produce(t, brokers, "orders", keys, n) }()
	b := start(t, newMember())
	time.Sleep(500 * time.Millisecond)
	if err := a.stop(); err != nil {
		t.Fatalf("a: %v", err)
	}
	cm := newMeter()
	c := start(t, newMember(consumer.MeterProvider(cm)))
	<-done
	waitFor(t, "all records applied", 60*time.Second, allApplied(s, keys, n))
	// Stopped before it joined, c would rightly report ErrNotJoined.
	waitFor(t, "c to join", 30*time.Second, func() bool { return cm.sum(t, "baton.consumer.rebalances") > 0 })
	for _, m := range []*member{b, c} {
		if err := m.stop(); err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	checkFold(t, s, keys, n)
	if v := f.Violations(); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
}

// A transient handler error retries the same batch (no skipping, no reordering) until it
// succeeds.
func TestTransientErrorRetriesSameBatch(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	const keys, n = 2, 5
	produce(t, brokers, "orders", keys, n)
	s := newStore(t)
	f := newFolder()
	var fails atomic.Int32
	var firstOffsets sync.Map
	f.block = func(ctx context.Context, b *consumer.Batch) error {
		if fails.Add(1) <= 3 {
			firstOffsets.Store(b.Records[0].Offset, true)
			return errTransient
		}
		return nil
	}
	m := newMeter()
	c, err := consumer.New("g", []string{"orders"}, s, nil, consumer.PerPartition(f.factory), consumer.Kafka(fastKafka(brokers)...),
		consumer.Logger(quiet), consumer.MeterProvider(m), consumer.RetryBackoff(time.Millisecond, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	waitFor(t, "all records applied", 30*time.Second, allApplied(s, keys, n))
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	checkFold(t, s, keys, n)
	if v := f.Violations(); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
	if got := m.sum(t, "baton.consumer.retries"); got < 3 {
		t.Errorf("retries metric %d, want >= 3", got)
	}
	firstOffsets.Range(func(k, _ any) bool {
		if k.(int64) != 0 {
			t.Errorf("a retried batch started at offset %d, want 0: a failed batch was skipped", k)
		}
		return true
	})
}

// fakeKafka is testenv.FakeKafka allowing the short session timeouts of fastKafka.
func fakeKafka(t *testing.T, opts ...kfake.Opt) []string {
	t.Helper()
	return testenv.FakeKafka(t, append(opts, kfake.BrokerConfigs(map[string]string{"group.min.session.timeout.ms": "500"}))...)
}
