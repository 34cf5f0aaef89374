package status_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/operator/status"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/pgoutbox"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// realEnv is a real broker's topic and a PostgreSQL schema with Baton's tables.
type realEnv struct {
	brokers []string
	store   string // the URL with search_path set to the test's schema
	pool    *pgxpool.Pool
	sink    *pgfence.Store
	box     *pgoutbox.Store
	topic   string
	group   string
}

func newRealEnv(t *testing.T, partitions int32) *realEnv {
	t.Helper()
	brokers := testenv.KafkaBrokers(t)
	pool, schema := testenv.Postgres(t)
	u, err := url.Parse(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	sink, err := pgfence.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	box, err := pgoutbox.New(pool, sink)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testenv.Context(t, 30*time.Second)
	if err := status.Migrate(ctx, io.Discard, u.String(), status.Tables{}); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return &realEnv{brokers: brokers, store: u.String(), pool: pool, sink: sink, box: box,
		topic: testenv.NewTopic(t, brokers, partitions), group: testenv.UniqueName("g")}
}

func (e *realEnv) collector(t *testing.T) *status.Collector {
	t.Helper()
	c, err := status.NewCollector(status.Config{Brokers: e.brokers, Store: e.store, Group: e.group, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// produce writes n records with keys k0..k(n-1) and returns the partition of each key.
func (e *realEnv) produce(t *testing.T, n int) map[string]int32 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.DefaultProduceTopic(e.topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := testenv.Context(t, 30*time.Second)
	out := map[string]int32{}
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, &kgo.Record{Key: []byte(fmt.Sprintf("k%03d", i)), Value: []byte("v")})
	}
	res := cl.ProduceSync(ctx, recs...)
	if err := res.FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	for _, r := range res {
		out[string(r.Record.Key)] = r.Record.Partition
	}
	return out
}

// produceLoop writes a record every interval until the test ends.
func (e *realEnv) produceLoop(t *testing.T, every time.Duration) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.DefaultProduceTopic(e.topic))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			cl.Produce(ctx, &kgo.Record{Key: []byte(fmt.Sprintf("live%d", i)), Value: []byte("v")}, nil)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait(); cl.Close() })
}

// member runs a Baton consumer in the group with the given client id until stop is called.
func (e *realEnv) member(t *testing.T, clientID string, mp metric.MeterProvider) (stop func()) {
	t.Helper()
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	c, err := consumer.New(e.group, []string{e.topic}, fence.Sink[pgx.Tx](e.sink),
		nil, consumer.PerPartition(func(context.Context, fence.Key, fence.Token) (consumer.Handler[pgx.Tx], error) {
			// Each batch appends one message to the outbox (no relay runs: it stays backlog).
			return consumer.Handler[pgx.Tx](func(ctx context.Context, tx pgx.Tx, b *consumer.Batch) error {
				return e.box.Append(ctx, tx, b.Key, b.Token, outbox.Message{Topic: e.topic + "-out", Value: []byte("n")})
			}), nil
		}),
		consumer.Kafka(kgo.SeedBrokers(e.brokers...), kgo.ClientID(clientID), kgo.FetchMaxWait(200*time.Millisecond),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())),
		consumer.Logger(slog.New(slog.DiscardHandler)), consumer.Telemetry(mp, nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := c.Run(ctx); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, consumer.ErrNotJoined) {
			t.Errorf("member %s: Run: %v", clientID, err)
		}
	}()
	stop = sync.OnceFunc(func() { cancel(); wg.Wait() })
	t.Cleanup(stop)
	return stop
}

// waitSnap polls c until ok accepts a snapshot, or fails the test after d with the last one.
func waitSnap(t *testing.T, c *status.Collector, d time.Duration, what string, ok func(*status.Snapshot) bool) *status.Snapshot {
	t.Helper()
	deadline := time.Now().Add(d)
	var last *status.Snapshot
	var lastErr error
	for time.Now().Before(deadline) {
		last, lastErr = c.Collect(context.Background())
		if last != nil && ok(last) {
			return last
		}
		time.Sleep(300 * time.Millisecond)
	}
	t.Fatalf("after %s: not %s; last snapshot %+v, err %v", d, what, last, lastErr)
	return nil
}

func allOwnedBy(clientID string, partitions int, caughtUp bool) func(*status.Snapshot) bool {
	return func(s *status.Snapshot) bool {
		if len(s.Partitions) != partitions {
			return false
		}
		for _, p := range s.Partitions {
			if p.Owner == nil || p.Owner.ClientID != clientID || p.Token == "" {
				return false
			}
			if caughtUp && (p.Lag == nil || *p.Lag != 0) {
				return false
			}
		}
		return true
	}
}
