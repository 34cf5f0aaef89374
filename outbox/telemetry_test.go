package outbox_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/sqliteoutbox"
)

// The relay's and the inbox's metrics report what happened: messages delivered, the backlog
// after a flush, one commit->ack latency per message, and inbox admissions and drops by
// reason (duplicate, stale).
func TestMetrics(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	brokers := testenv.FakeKafka(t, kfake.SeedTopics(1, "cmds"))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })

	fences, err := sqlitefence.Open(filepath.Join(t.TempDir(), "m.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer fences.Close()
	box, err := sqliteoutbox.New(fences)
	if err == nil {
		err = box.Migrate(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	src := fence.Key{Group: "g", Topic: "orders", Partition: 0}
	tok := fence.Token{Epoch: 1}
	if _, err := fences.Claim(ctx, src, tok, "test"); err != nil {
		t.Fatal(err)
	}
	const n = 5
	if err := fences.Apply(ctx, src, tok, 0, 0, func(ctx context.Context, tx *sql.Tx) error {
		msgs := make([]outbox.Message, n)
		for i := range msgs {
			msgs[i] = outbox.Message{Topic: "cmds", Key: []byte("dev"), Value: []byte{byte(i)}}
		}
		return box.Append(ctx, tx, src, tok, msgs...)
	}); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	relay, err := outbox.NewRelay(cl, box, outbox.Telemetry(mp, nil))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := relay.Flush(ctx, src, tok); err != nil || got != n {
		t.Fatalf("Flush = %d, %v; want %d", got, err, n)
	}

	// Consume what the relay published and admit it twice, plus a stale copy.
	in, err := outbox.NewInbox[*sql.Tx]("gateway", fences, outbox.Telemetry(mp, nil))
	if err != nil {
		t.Fatal(err)
	}
	consumerCl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("cmds"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer consumerCl.Close()
	var recs []*kgo.Record
	for len(recs) < n {
		fs := consumerCl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatal("records not consumed")
		}
		recs = append(recs, fs.Records()...)
	}
	pos := int64(0)
	nextPos := func() int64 { pos++; return pos }
	admit := func(r *kgo.Record) fence.Verdict {
		var v fence.Verdict
		err := fences.Apply(ctx, fence.Key{Group: "gw", Topic: "cmds", Partition: 0}, fence.Token{Epoch: 1}, nextPos(), nextPos(), func(ctx context.Context, tx *sql.Tx) error {
			var err error
			v, err = in.Admit(ctx, tx, r)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if _, err := fences.Claim(ctx, fence.Key{Group: "gw", Topic: "cmds", Partition: 0}, fence.Token{Epoch: 1}, "test"); err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if v := admit(r); v != fence.Admitted {
			t.Fatalf("first delivery: %s", v)
		}
	}
	if v := admit(recs[n-1]); v != fence.Duplicate {
		t.Fatalf("copy: %s, want duplicate", v)
	}
	stale := &kgo.Record{Topic: "cmds", Key: recs[0].Key, Value: recs[0].Value}
	for _, h := range recs[0].Headers {
		if h.Key == "baton-token" {
			h.Value = []byte("0.0") // an older owner's record
		}
		stale.Headers = append(stale.Headers, h)
	}
	if v := admit(stale); v != fence.Stale {
		t.Fatalf("older token: %s, want stale", v)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	sums := map[string]int64{}
	var backlog int64 = -1
	var latencies uint64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					key := m.Name
					if r, ok := p.Attributes.Value(attribute.Key("reason")); ok {
						key += "/" + r.AsString()
					}
					sums[key] += p.Value
				}
			case metricdata.Gauge[int64]:
				if m.Name == "baton.outbox.backlog" && len(d.DataPoints) == 1 {
					backlog = d.DataPoints[0].Value
				}
			case metricdata.Histogram[float64]:
				if m.Name == "baton.outbox.commit_to_ack" {
					for _, p := range d.DataPoints {
						latencies += p.Count
						// The unit is seconds: the bounds must be seconds too (the SDK's
						// default, 0, 5, 10 ... 10000, is meant for milliseconds), and an
						// append acknowledged within this test lands below ten seconds.
						if !slices.Contains(p.Bounds, 0.005) || !slices.Contains(p.Bounds, 1) {
							t.Errorf("commit_to_ack bounds %v are not seconds", p.Bounds)
						}
						var below uint64
						for i, b := range p.Bounds {
							if b <= 10 {
								below += p.BucketCounts[i]
							}
						}
						if below != p.Count {
							t.Errorf("commit_to_ack: %d of %d at or below 10 s (bounds %v, counts %v)", below, p.Count, p.Bounds, p.BucketCounts)
						}
					}
				}
			}
		}
	}
	want := map[string]int64{"baton.outbox.delivered": n, "baton.inbox.admitted": n,
		"baton.inbox.drops/duplicate": 1, "baton.inbox.drops/stale": 1}
	for k, v := range want {
		if sums[k] != v {
			t.Errorf("%s = %d, want %d (all sums %v)", k, sums[k], v, sums)
		}
	}
	if backlog != 0 {
		t.Errorf("backlog gauge %d after a full flush, want 0", backlog)
	}
	if latencies != n {
		t.Errorf("commit_to_ack recorded %d times, want once per message (%d)", latencies, n)
	}
}
