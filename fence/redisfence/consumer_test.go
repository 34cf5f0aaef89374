package redisfence

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// TestConsumerFoldsTwinsIntoRedis runs the consumer on an in-process Kafka with the Redis sink:
// each device's readings folded into its hash (its last reading and a count of updates), in
// the keys of the partition's hash tag, every batch in one fenced script.
func TestConsumerFoldsTwinsIntoRedis(t *testing.T) {
	s, c, user := shared(t)
	brokers := testenv.FakeKafka(t, kfake.SeedTopics(2, "telemetry"))
	ctx := testenv.Context(t, 60*time.Second)
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("telemetry"))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	const devices, readings = 5, 8
	for i := range readings {
		for d := range devices {
			r := &kgo.Record{Key: fmt.Appendf(nil, "d%d", d), Value: fmt.Appendf(nil, "%d", i)}
			if err := prod.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	group := testenv.UniqueName("redisfence")
	twin := func(tag, device string) string { return user + "twin:" + tag + ":" + device }
	cons, err := consumer.New(group, []string{"telemetry"}, s,
		func(ctx context.Context, tx *Tx, b *consumer.Batch) error {
			tag := HashTag(b.Key.Group, b.Key.Topic)
			for _, r := range b.Records {
				tx.HSet(twin(tag, string(r.Key)), "reading", string(r.Value))
				tx.HIncrBy(twin(tag, string(r.Key)), "updates", 1)
			}
			return nil
		},
		consumer.Kafka(kgo.SeedBrokers(brokers...)), consumer.Logger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cons.Run(runCtx) }()
	tag := HashTag(group, "telemetry")
	for {
		total := 0
		for d := range devices {
			n, _ := c.HGet(ctx, twin(tag, fmt.Sprintf("d%d", d)), "updates").Int()
			total += n
		}
		if total == devices*readings {
			break
		}
		if total > devices*readings || ctx.Err() != nil {
			cancel()
			t.Fatalf("%d updates applied, want %d (%v)", total, devices*readings, <-done)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	for d := range devices {
		v, err := c.HMGet(ctx, twin(tag, fmt.Sprintf("d%d", d)), "reading", "updates").Result()
		if err != nil || v[0] != fmt.Sprint(readings-1) || v[1] != fmt.Sprint(readings) {
			t.Errorf("twin d%d = %v, %v; want its last reading %d after %d updates", d, v, err, readings-1, readings)
		}
	}
}
