package outboxconsumer_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/outboxconsumer"
)

// A record of a deposed producer (a lower token than one the inbox already admitted for the
// entity: Stale) whose lanes preparation fails for good reaches the dead-letter transaction.
// The admission refuses it, so it is dropped, as outboxconsumer.Handler drops a stale record.
// It is no copy of a record already applied or dead-lettered: counted as a duplicate it says
// so, and the inbox counted it as stale.
func TestStaleRecordRefusedByTheDeadLetterAdmissionIsNotCountedAsADuplicate(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	brokers := testenv.FakeKafka(t, kfake.SeedTopics(1, "commands", "commands.dlq"), kfake.GroupMinSessionTimeout(time.Second))
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("commands"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	relayed := func(key, token string, seq int) *kgo.Record {
		return &kgo.Record{Key: []byte(key), Value: []byte(key), Headers: []kgo.RecordHeader{
			{Key: "baton-token", Value: []byte(token)},
			{Key: "baton-seq", Value: []byte(fmt.Sprint(seq))},
			{Key: "baton-source", Value: []byte("sender/events/0")},
		}}
	}
	// Offset 0: the current producer's message; offset 1: a deposed producer's, stale.
	for _, r := range []*kgo.Record{relayed("m", "0.2", 1), relayed("m", "0.1", 2)} {
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	store, err := sqlitefence.Open(filepath.Join(t.TempDir(), "receiver.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	inbox, err := outbox.NewInbox[*sql.Tx]("receiver", store)
	if err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	apply := consumer.Handler[*sql.Tx](func(context.Context, *sql.Tx, *consumer.Batch) error { return nil })
	c, err := consumer.New("receiver", []string{"commands"}, fence.Sink[*sql.Tx](store), outboxconsumer.Handler(inbox, apply),
		consumer.Kafka(kgo.SeedBrokers(brokers...), kgo.FetchMaxWait(100*time.Millisecond)), consumer.Logger(quiet()),
		consumer.Telemetry(mp, nil, nil), outboxconsumer.AdmitDeadLetters(inbox),
		consumer.Lanes(2, func(_ context.Context, _ fence.Key, _ fence.Token, r *kgo.Record) (any, error) {
			if r.Offset == 1 {
				return nil, consumer.Permanent(fmt.Errorf("cannot prepare"))
			}
			return nil, nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	k := fence.Key{Group: "receiver", Topic: "commands", Partition: 0}
	for {
		st, err := store.Load(ctx, k)
		if err == nil && st.Position >= 1 {
			break
		}
		if ctx.Err() != nil {
			cancel()
			t.Fatalf("timed out waiting for both records: %v %+v", err, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	var dups int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if s, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "baton.consumer.records.duplicates_skipped" {
				for _, dp := range s.DataPoints {
					dups += dp.Value
				}
			}
		}
	}
	if dups != 0 {
		t.Fatalf("baton.consumer.records.duplicates_skipped = %d: a deposed producer's record, refused as stale by the dead-letter admission, was counted (and logged) as a copy of a record already applied or dead-lettered", dups)
	}
}
