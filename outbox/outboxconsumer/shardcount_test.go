package outboxconsumer_test

import (
	"context"
	"errors"
	"hash/fnv"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/outboxconsumer"
)

// The standalone relay's shard count: its shard count is the coordination topic's
// partition count, and the application chooses an entity's shard with it (hash modulo the
// count). Changing it moves entities between shards; an entity's older rows still pending in
// its old shard and its newer rows in the new one are then relayed by two shard owners at
// once, and the inbox, which orders per (source shard, key), admits both in whatever order
// they arrive.

// readClock is a relay's view of the outbox store that remembers when the relay last read each
// shard's pending rows (every flush does).
type readClock struct {
	outbox.Store
	mu   sync.Mutex
	last map[int32]time.Time
}

func (s *readClock) Pending(ctx context.Context, src fence.Key, tok fence.Token, limit int) ([]outbox.Row, error) {
	s.mu.Lock()
	s.last[src.Partition] = time.Now()
	s.mu.Unlock()
	return s.Store.Pending(ctx, src, tok, limit)
}

// readSince reports whether the relay read each shard of ps after t.
func (s *readClock) readSince(t time.Time, ps ...int32) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range ps {
		if !s.last[p].After(t) {
			return false
		}
	}
	return true
}

// shardOf is the application's choice of shard: the key's hash modulo the shard count.
func shardOf(k string, shards int32) int32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(k))
	return int32(h.Sum32() % uint32(shards))
}

// within polls cond until it holds, failing the test after bound.
func within(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", bound, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestStandaloneRelayShardCountChange: kfake and SQLite. See testShardCountChange.
func TestStandaloneRelayShardCountChange(t *testing.T) {
	ctx := testenv.Context(t, 2*time.Minute)
	brokers := testenv.FakeKafka(t, kfake.SeedTopics(2, coordTopic), kfake.SeedTopics(3, "commands"))
	testShardCountChange(t, ctx, sqliteApp(t, ctx), brokers, relayGroup, coordTopic, "commands")
}

// TestRealStandaloneRelayShardCountChange: the real broker and PostgreSQL.
func TestRealStandaloneRelayShardCountChange(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	ctx := testenv.Context(t, 3*time.Minute)
	app := pgApp(t, ctx)
	coord, dest := testenv.NewTopic(t, brokers, 2), testenv.NewTopic(t, brokers, 3)
	testShardCountChange(t, ctx, app, brokers, testenv.UniqueName("relay"), coord, dest)
}

// testShardCountChange runs a standalone relay of 2 shards, grows its coordination topic to 3
// while it runs, and follows the drain-then-change procedure. Once the member sees the growth
// (within its 5 s topic look) every shard is held: the relay stops reading its rows (mutant
// IdleTopicChangeUnchecked of the consumer: the older shards relay on), the refusal is
// counted, rows appended meanwhile wait; the application cannot prepare 3 shards before the
// growth is acknowledged (mutant PrepareShardsCountUnchecked: it can), nor shrink. After the
// acknowledgement the backlog is relayed, then the application appends with 3 shards (keys
// moved), and every key's messages reach the destination in order.
func testShardCountChange[Tx any](t *testing.T, ctx context.Context, app appSide[Tx], brokers []string, group, coord, dest string) {
	ts, ok := app.sink.(fence.Topics)
	if !ok {
		t.Fatalf("%T stores no topic identities", app.sink)
	}
	if err := outboxconsumer.PrepareShards(ctx, app.sink, group, coord, 2); err != nil {
		t.Fatal(err)
	}
	const keys = 12
	moved := 0
	for k := range keys {
		if key := "k" + strconv.Itoa(k); shardOf(key, 2) != shardOf(key, 3) {
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("no key moves from 2 shards to 3: the fault would not happen")
	}
	next := map[string]int{}
	appendAll := func(shards int32, perKey int) {
		t.Helper()
		for range perKey {
			for k := range keys {
				key := "k" + strconv.Itoa(k)
				msg := outbox.Message{Topic: dest, Key: []byte(key), Value: []byte(strconv.Itoa(next[key]))}
				if err := app.appendTo(ctx, outboxconsumer.ShardKey(group, coord, shardOf(key, shards)), key, msg); err != nil {
					t.Fatalf("append %s to %d shards: %v", key, shards, err)
				}
				next[key]++
			}
		}
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	delivered := func() int64 {
		ends, err := adm.ListEndOffsets(ctx, dest)
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
		return n
	}
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	refusals := func() int64 {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if s, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "baton.consumer.topic_refusals" {
					for _, dp := range s.DataPoints {
						n += dp.Value
					}
				}
			}
		}
		return n
	}

	spy := &readClock{Store: app.store, last: map[int32]time.Time{}}
	rcl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer rcl.Close()
	relay, err := outbox.NewRelay(rcl, spy)
	if err != nil {
		t.Fatal(err)
	}
	c, err := outboxconsumer.NewStandaloneRelay(group, coord, app.sink, relay, 50*time.Millisecond,
		consumer.Kafka(kgo.SeedBrokers(brokers...), kgo.MetadataMinAge(200*time.Millisecond), kgo.MetadataMaxAge(time.Second)),
		consumer.Logger(quiet()), consumer.Telemetry(mp, nil, nil), consumer.RetryBackoff(20*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay Run: %v", err)
		}
	}()

	appendAll(2, 5)
	within(t, time.Minute, "the first rows delivered", func() bool { return delivered() >= keys*5 })

	// The change: the coordination topic grows from 2 to 3 partitions while the relay runs.
	if r, err := adm.CreatePartitions(ctx, 1, coord); err != nil || r.Error() != nil {
		t.Fatalf("growing %s: %v %v", coord, err, r.Error())
	}
	grown := time.Now()
	// Held: both shards' relays stop reading their rows once the member looked (every 5 s).
	var held time.Time
	within(t, 30*time.Second, "shards 0 and 1 held (no read for 1 s)", func() bool {
		held = time.Now()
		return !spy.readSince(held.Add(-time.Second), 0) && !spy.readSince(held.Add(-time.Second), 1) && held.Sub(grown) > time.Second
	})
	within(t, 10*time.Second, "the hold counted in baton.consumer.topic_refusals", func() bool { return refusals() >= 2 })
	before := delivered()
	appendAll(2, 2) // rows appended while held wait
	time.Sleep(time.Second)
	if spy.readSince(held, 0) || spy.readSince(held, 1) || spy.readSince(time.Time{}, 2) {
		t.Fatal("a shard was relayed while the grown coordination topic was held")
	}
	if n := delivered(); n != before {
		t.Fatalf("%d records published while held", n-before)
	}

	// The application cannot move keys before the acknowledgement, nor shrink.
	if err := outboxconsumer.PrepareShards(ctx, app.sink, group, coord, 3); !errors.Is(err, fence.ErrTopicGrown) {
		t.Fatalf("PrepareShards(3) before the growth was acknowledged: %v, want fence.ErrTopicGrown", err)
	}
	if err := outboxconsumer.PrepareShards(ctx, app.sink, group, coord, 1); !errors.Is(err, outbox.ErrInvalid) {
		t.Fatalf("PrepareShards(1) below the acknowledged count: %v, want outbox.ErrInvalid", err)
	}

	// The operator acknowledges the growth (baton topics ack), drained apart from the rows
	// appended under the old count, which the relay now delivers before any row of the new one.
	h, err := ts.TopicHistory(ctx, group, coord)
	if err != nil || len(h) == 0 || h[len(h)-1].Identity.Partitions != 2 {
		t.Fatalf("the shard count stored with the fences: %+v, %v; want 2", h, err)
	}
	two := h[len(h)-1].Identity
	three := two
	three.Partitions = 3
	if err := ts.ResetTopic(ctx, group, coord, two, three, "test: growth acknowledged"); err != nil {
		t.Fatal(err)
	}
	within(t, time.Minute, "the rows appended while held delivered", func() bool { return delivered() >= keys*7 })
	if err := outboxconsumer.PrepareShards(ctx, app.sink, group, coord, 3); err != nil {
		t.Fatalf("PrepareShards(3) after the acknowledgement: %v", err)
	}
	appendAll(3, 5)
	within(t, time.Minute, "the rows of the new count delivered", func() bool { return delivered() >= keys*12 })
	if !spy.readSince(time.Time{}, 2) {
		t.Fatal("shard 2 was never relayed")
	}

	// Every key in order at the destination (re-published copies repeat an earlier value).
	seen := map[string]int{}
	for _, r := range readAll(t, ctx, brokers, dest) {
		k := string(r.Key)
		v, err := strconv.Atoi(string(r.Value))
		if err != nil {
			t.Fatal(err)
		}
		last, ok := seen[k]
		switch {
		case !ok && v != 0, ok && v > last+1:
			t.Fatalf("key %s: %d delivered after %d (moved keys out of order)", k, v, last)
		case !ok || v == last+1:
			seen[k] = v
		}
	}
	for k := range keys {
		if key := "k" + strconv.Itoa(k); seen[key] != 11 {
			t.Fatalf("key %s: delivered up to %d, want 11", key, seen[key])
		}
	}
	t.Logf("%d of %d keys moved between shards; held %.1fs after the growth", moved, keys, held.Sub(grown).Seconds())
}

// PrepareShards records the application's shard count with the fences (fence.Topics) and
// refuses another count until an operator acknowledges it; a sink without topic identities is
// not checked. Memory only. (Mutant PrepareShardsCountUnchecked: every count is accepted.)
func TestPrepareShardsChecksTheShardCount(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	sink, err := memfence.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := outboxconsumer.PrepareShards(ctx, sink, relayGroup, coordTopic, 4); err != nil {
		t.Fatal(err)
	}
	h, err := sink.TopicHistory(ctx, relayGroup, coordTopic)
	if err != nil || len(h) != 1 || h[0].Identity.Partitions != 4 {
		t.Fatalf("recorded %+v, %v: want the count 4", h, err)
	}
	if err := outboxconsumer.PrepareShards(ctx, sink, relayGroup, coordTopic, 4); err != nil {
		t.Fatalf("the same count again: %v", err)
	}
	err = outboxconsumer.PrepareShards(ctx, sink, relayGroup, coordTopic, 5)
	var te *fence.TopicError
	if !errors.Is(err, fence.ErrTopicGrown) || !errors.As(err, &te) || te.Stored.Partitions != 4 || te.Seen.Partitions != 5 {
		t.Fatalf("5 shards with 4 acknowledged: %v, want a *fence.TopicError (grown 4 -> 5)", err)
	}
	if st, err := sink.Load(ctx, outboxconsumer.ShardKey(relayGroup, coordTopic, 4)); err != nil || st.Claimant != "" {
		t.Fatalf("shard 4 prepared by a refused call: %+v, %v", st, err)
	}
	if err := outboxconsumer.PrepareShards(ctx, sink, relayGroup, coordTopic, 3); !errors.Is(err, outbox.ErrInvalid) {
		t.Fatalf("3 shards with 4 acknowledged: %v, want outbox.ErrInvalid", err)
	}
	if err := sink.ResetTopic(ctx, relayGroup, coordTopic, h[0].Identity, fence.Topic{Partitions: 5}, "test: ack"); err != nil {
		t.Fatal(err)
	}
	if err := outboxconsumer.PrepareShards(ctx, sink, relayGroup, coordTopic, 5); err != nil {
		t.Fatalf("5 shards after the acknowledgement: %v", err)
	}
	if st, err := sink.Load(ctx, outboxconsumer.ShardKey(relayGroup, coordTopic, 4)); err != nil || st.Claimant == "" {
		t.Fatalf("shard 4 not prepared after the acknowledgement: %+v, %v", st, err)
	}
}
