package outbox_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/sqliteoutbox"
)

// relayEnv is a claimed source partition with an SQLite outbox, a kfake cluster and a relay.
type relayEnv struct {
	ctx     context.Context
	src     fence.Key
	tok     fence.Token
	fences  *sqlitefence.Store
	box     *sqliteoutbox.Store
	client  *kgo.Client
	brokers []string
	reader  *sdkmetric.ManualReader
	relay   *outbox.Relay
}

func newRelayEnv(t *testing.T, kopts []kfake.Opt, copts []kgo.Opt, opts ...outbox.RelayOption) *relayEnv {
	t.Helper()
	e := &relayEnv{ctx: testenv.Context(t, time.Minute), src: fence.Key{Group: "g", Topic: "orders", Partition: 0}, tok: fence.Token{Epoch: 1}}
	e.brokers = testenv.FakeKafka(t, kopts...)
	e.reader = sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(e.reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	var err error
	if e.fences, err = sqlitefence.Open(filepath.Join(t.TempDir(), "r.db")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.fences.Close() })
	if e.box, err = sqliteoutbox.New(e.fences); err == nil {
		err = e.box.Migrate(e.ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.fences.Claim(e.ctx, e.src, e.tok, "test"); err != nil {
		t.Fatal(err)
	}
	if e.client, err = kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(e.brokers...)}, copts...)...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.client.Close)
	if e.relay, err = outbox.NewRelay(e.client, e.box, append([]outbox.RelayOption{outbox.Telemetry(mp, nil)}, opts...)...); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *relayEnv) append(t *testing.T, msgs ...outbox.Message) {
	t.Helper()
	pos := time.Now().UnixNano()
	if err := e.fences.Apply(e.ctx, e.src, e.tok, pos, pos, func(ctx context.Context, tx *sql.Tx) error {
		return e.box.Append(ctx, tx, e.src, e.tok, msgs...)
	}); err != nil {
		t.Fatal(err)
	}
}

func (e *relayEnv) pendingValues(t *testing.T) []string {
	t.Helper()
	rows, err := e.box.Pending(e.ctx, e.src, e.tok, 100)
	if err != nil {
		t.Fatal(err)
	}
	var vs []string
	for _, r := range rows {
		vs = append(vs, string(r.Value))
	}
	return vs
}

// metrics returns the dead_lettered counter by reason and the oldest_pending_age gauge.
func (e *relayEnv) metrics(t *testing.T) (dead map[string]int64, oldest float64) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := e.reader.Collect(e.ctx, &rm); err != nil {
		t.Fatal(err)
	}
	dead, oldest = map[string]int64{}, -1
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				if m.Name == "baton.outbox.dead_lettered" {
					for _, p := range d.DataPoints {
						r, _ := p.Attributes.Value(attribute.Key("reason"))
						dead[r.AsString()] += p.Value
					}
				}
			case metricdata.Gauge[float64]:
				if m.Name == "baton.outbox.oldest_pending_age" && len(d.DataPoints) == 1 {
					oldest = d.DataPoints[0].Value
				}
			}
		}
	}
	return dead, oldest
}

func (e *relayEnv) consume(t *testing.T, topic string, atLeast int) []string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
	defer cancel()
	var vs []string
	for len(vs) < atLeast && ctx.Err() == nil {
		for _, r := range cl.PollFetches(ctx).Records() {
			vs = append(vs, string(r.Value))
		}
	}
	return vs
}

// A row larger than its destination topic's max.message.bytes (below the store's append check)
// would fail every Flush at the same row for ever. It is dead-lettered
// under the fence, with its reason, after the row produced alone is refused again, and the rows
// after it are delivered, including a small one to the same topic that the broker refused only
// because it shared the too-large record batch.
func TestRelayDeadLettersARowTheTopicRefusesAndGoesOn(t *testing.T) {
	e := newRelayEnv(t, []kfake.Opt{kfake.SeedTopics(1, "dest")}, nil, outbox.BatchSize(10))
	adm := kadm.NewClient(e.client)
	if _, err := adm.CreateTopic(e.ctx, 1, 1, map[string]*string{"max.message.bytes": kadm.StringPtr("1000")}, "small"); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 3000) // incompressible: the producer compresses batches
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	e.append(t,
		outbox.Message{Topic: "dest", Key: []byte("k"), Value: []byte("a")},
		outbox.Message{Topic: "small", Key: []byte("k"), Value: big},
		outbox.Message{Topic: "small", Key: []byte("k"), Value: []byte("c")},
		outbox.Message{Topic: "dest", Key: []byte("k"), Value: []byte("d")})

	n, err := e.relay.Flush(e.ctx, e.src, e.tok)
	if err != nil || n != 3 {
		t.Fatalf("Flush = %d, %v; want 3 delivered and the large row dead-lettered", n, err)
	}
	if p := e.pendingValues(t); len(p) != 0 {
		t.Fatalf("pending after Flush: %q", p)
	}
	dl, err := e.box.DeadLetters(e.ctx, e.src, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dl) != 1 || dl[0].Seq != 2 || !bytes.Equal(dl[0].Value, big) || dl[0].By != e.tok ||
		!strings.HasPrefix(dl[0].Reason, "message_too_large"+": ") {
		t.Fatalf("dead letters = %+v, want seq 2 with reason %s", dl, "message_too_large")
	}
	if got := e.consume(t, "small", 1); len(got) != 1 || got[0] != "c" {
		t.Fatalf("topic small holds %q, want [c]", got)
	}
	if got := e.consume(t, "dest", 2); len(got) < 2 || got[0] != "a" || got[len(got)-1] != "d" {
		t.Fatalf("topic dest holds %q, want a, then d (maybe twice)", got)
	}
	dead, oldest := e.metrics(t)
	if dead["message_too_large"] != 1 || len(dead) != 1 {
		t.Errorf("dead_lettered = %v, want 1 %s", dead, "message_too_large")
	}
	if oldest != 0 {
		t.Errorf("oldest_pending_age = %v after everything was delivered or dead-lettered, want 0", oldest)
	}
}

// A row whose destination topic does not exist holds up each Flush for at most FlushTimeout
// (the AfterCommit hook returns, the rows stay pending, the oldest-row gauge shows the age),
// and is dead-lettered only once metadata confirmed the topic missing at 3 flushes or more over
// GiveUpAfter; the row behind it is delivered then.
func TestRelayMissingTopicIsBoundedThenDeadLettered(t *testing.T) {
	const timeout, giveUp = 400 * time.Millisecond, 1500 * time.Millisecond
	// UnknownTopicRetries(-1): the client waits for a missing topic for ever (franz-go's
	// default gives up after 4 metadata loads, which on a real cluster takes a while), so
	// only the relay's own bound ends each flush.
	e := newRelayEnv(t, []kfake.Opt{kfake.SeedTopics(1, "dest")}, []kgo.Opt{kgo.UnknownTopicRetries(-1)},
		outbox.FlushTimeout(timeout), outbox.GiveUpAfter(giveUp))
	e.append(t,
		outbox.Message{Topic: "gone", Key: []byte("k"), Value: []byte("lost")},
		outbox.Message{Topic: "dest", Key: []byte("k"), Value: []byte("b")})
	hook := e.relay.AfterCommit()
	start := time.Now()
	flushes := 0
	for {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("after %d flushes the row is still pending: %q", flushes, e.pendingValues(t))
		}
		began := time.Now()
		hctx, cancel := context.WithTimeout(e.ctx, timeout+2*time.Second) // fails fast without the relay's bound
		err := hook(hctx, e.src, e.tok)
		cancel()
		took := time.Since(began)
		flushes++
		if took > timeout+time.Second {
			t.Fatalf("flush %d held up the partition for %v, FlushTimeout is %v", flushes, took, timeout)
		}
		if err == nil {
			break
		}
		if !errors.Is(err, outbox.ErrFlushTimeout) {
			t.Fatalf("flush %d: %v, want ErrFlushTimeout", flushes, err)
		}
		switch p := e.pendingValues(t); {
		case len(p) == 2: // still waiting for the topic
		case len(p) == 1 && p[0] == "b": // dead-lettered, then the flush ran out of time
		default:
			t.Fatalf("flush %d: pending %q, want both rows kept, or b after lost was dead-lettered", flushes, p)
		}
		if _, oldest := e.metrics(t); oldest <= 0 {
			t.Fatalf("flush %d: oldest_pending_age = %v with a stuck row, want > 0", flushes, oldest)
		}
	}
	if elapsed := time.Since(start); flushes < 3 || elapsed < giveUp {
		t.Fatalf("dead-lettered after %d flushes and %v, want at least 3 and %v", flushes, elapsed, giveUp)
	}
	dl, err := e.box.DeadLetters(e.ctx, e.src, 10)
	if err != nil || len(dl) != 1 || dl[0].Seq != 1 || !strings.HasPrefix(dl[0].Reason, "unknown_topic"+": ") {
		t.Fatalf("dead letters = %+v, %v; want seq 1, %s", dl, err, "unknown_topic")
	}
	// b shared the first flush's batch with the stuck row, so it was published then, and
	// again after the row was dead-lettered; the flushes in between tried the stuck row alone.
	if got := e.consume(t, "dest", 2); len(got) != 2 || got[0] != "b" || got[1] != "b" {
		t.Fatalf("dest holds %q, want b published twice (the first batch, then after the dead letter)", got)
	}
	if dead, oldest := e.metrics(t); dead["unknown_topic"] != 1 || oldest != 0 {
		t.Fatalf("dead_lettered %v, oldest_pending_age %v; want 1 %s and 0", dead, oldest, "unknown_topic")
	}
}

// A topic the relay's principal may not write to (TopicAuthorizationFailed on produce, here
// injected into kfake's produce handling) is given up only after GiveUpAfter, since an ACL may
// still be granted; until then the row stays pending and each flush tries it alone.
func TestRelayTopicAuthorizationIsGivenUpAfterGiveUpAfter(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "dest", "denied"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	ctx := testenv.Context(t, time.Minute)
	probe, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	details, err := kadm.NewClient(probe).ListTopics(ctx, "denied")
	probe.Close()
	if err != nil {
		t.Fatal(err)
	}
	deniedID := details["denied"].ID
	var refused atomic.Int64
	cluster.ControlKey(int16(kmsg.Produce), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		req := kr.(*kmsg.ProduceRequest)
		denied := false
		for _, rt := range req.Topics {
			denied = denied || rt.Topic == "denied" || rt.TopicID == deniedID
		}
		if !denied {
			return nil, nil, false
		}
		refused.Add(1)
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			code := kerr.NotLeaderForPartition.Code // the other topics of the request: retried
			if rt.Topic == "denied" || rt.TopicID == deniedID {
				code = kerr.TopicAuthorizationFailed.Code
			}
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})

	const giveUp = time.Second
	e := newRelayEnv(t, nil, nil, outbox.FlushTimeout(2*time.Second), outbox.GiveUpAfter(giveUp))
	// newRelayEnv made its own cluster; point a relay at this one instead.
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.MetadataMinAge(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	relay, err := outbox.NewRelay(cl, e.box, outbox.FlushTimeout(2*time.Second), outbox.GiveUpAfter(giveUp))
	if err != nil {
		t.Fatal(err)
	}
	e.brokers = cluster.ListenAddrs()
	e.append(t,
		outbox.Message{Topic: "denied", Key: []byte("k"), Value: []byte("x")},
		outbox.Message{Topic: "dest", Key: []byte("k"), Value: []byte("y")})
	start := time.Now()
	flushes := 0
	for {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("still pending after %d flushes: %q", flushes, e.pendingValues(t))
		}
		_, err := relay.Flush(ctx, e.src, e.tok)
		flushes++
		if err == nil {
			break
		}
		if !errors.Is(err, kerr.TopicAuthorizationFailed) {
			t.Fatalf("flush %d: %v, want TopicAuthorizationFailed", flushes, err)
		}
		if p := e.pendingValues(t); len(p) != 2 {
			t.Fatalf("flush %d: pending %q before GiveUpAfter, want both rows", flushes, p)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if elapsed := time.Since(start); elapsed < giveUp || flushes < 3 {
		t.Fatalf("given up after %v and %d flushes, want at least %v and 3", elapsed, flushes, giveUp)
	}
	dl, err := e.box.DeadLetters(ctx, e.src, 10)
	if err != nil || len(dl) != 1 || dl[0].Seq != 1 || !strings.HasPrefix(dl[0].Reason, "topic_authorization_failed"+": ") {
		t.Fatalf("dead letters = %+v, %v; want seq 1 %s", dl, err, "topic_authorization_failed")
	}
	if got := e.consume(t, "dest", 1); len(got) < 1 || got[0] != "y" {
		t.Fatalf("dest holds %q, want y", got)
	}
	if n := refused.Load(); n < 3 {
		t.Fatalf("the broker refused %d produce requests, want at least 3", n)
	}
}

// A row that failed the last flush is tried alone first; once it goes through (its topic was
// created), the same Flush delivers the rows behind it too.
func TestRelayStuckRowRecoversAndTheRestFollows(t *testing.T) {
	e := newRelayEnv(t, []kfake.Opt{kfake.SeedTopics(1, "dest")}, []kgo.Opt{kgo.UnknownTopicRetries(-1), kgo.MetadataMinAge(50 * time.Millisecond)},
		outbox.FlushTimeout(500*time.Millisecond), outbox.GiveUpAfter(time.Hour), outbox.BatchSize(10))
	e.append(t,
		outbox.Message{Topic: "late", Key: []byte("k"), Value: []byte("1")},
		outbox.Message{Topic: "dest", Key: []byte("k"), Value: []byte("2")},
		outbox.Message{Topic: "dest", Key: []byte("k"), Value: []byte("3")})
	if n, err := e.relay.Flush(e.ctx, e.src, e.tok); n != 0 || !errors.Is(err, outbox.ErrFlushTimeout) {
		t.Fatalf("Flush before the topic exists = %d, %v; want 0, ErrFlushTimeout", n, err)
	}
	if _, err := kadm.NewClient(e.client).CreateTopic(e.ctx, 1, 1, nil, "late"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := e.relay.Flush(e.ctx, e.src, e.tok)
		if err == nil {
			if n != 3 {
				t.Fatalf("Flush after the topic was created = %d, want all 3 rows", n)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Flush after the topic was created: %v", err)
		}
	}
	if p := e.pendingValues(t); len(p) != 0 {
		t.Fatalf("pending %q, want none", p)
	}
	if dl, err := e.box.DeadLetters(e.ctx, e.src, 10); err != nil || len(dl) != 0 {
		t.Fatalf("dead letters %v, %v; want none", dl, err)
	}
}
