package consumer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// franz-go's older KIP-848 opt-in, a context value given with kgo.WithContext, makes it join as
// a KIP-848 member exactly as kgo.ServerSideBalancer does, while the consumer keeps the classic
// protocol's epoch source: no partition would ever be applied, and Run would return nil when
// ctx ends. Run refuses it at once, as it refuses kgo.ServerSideBalancer with the classic
// protocol. franz-go takes any value under the key as the opt-in, false included.
func TestContextOptInWithClassicSource(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	produceSeq(t, brokers, "orders", 1, 1, 2)
	for _, v := range []any{true, false} {
		//lint:ignore SA1029 franz-go reads this plain string key
		optIn := context.WithValue(context.Background(), "opt_in_kafka_next_gen_balancer_beta", v)
		cons, err := consumer.New("g", []string{"orders"}, newStore(t), nil, consumer.PerPartition(newFolder().factory),
			consumer.Kafka(append(fastKafka(brokers), kgo.WithContext(optIn))...), consumer.Logger(quiet))
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		start := time.Now()
		err = cons.Run(ctx)
		cancel()
		if !errors.Is(err, consumer.ErrInvalidOption) || !strings.Contains(err.Error(), "KIP-848 opt-in") {
			t.Errorf("Run with the KIP-848 context opt-in (%v) and the classic protocol = %v after %v, want ErrInvalidOption naming the opt-in", v, err, time.Since(start).Round(time.Millisecond))
		}
	}
}
