package consumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
	"github.com/twmb/franz-go/pkg/kfake"
)

// A fatal error that coincides with the caller's cancellation is still Run's result: a
// handler factory that fails while the member is being stopped must not turn into a clean
// shutdown (nil). The factory cancels Run's context and then fails, so both are ready when the
// fetch loop next looks; each round is one race, and one nil among them fails the test.
func TestFatalErrorWinsOverCancellation(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	boom := errors.New("factory cannot open its resources")
	for round := range 12 {
		ctx, cancel := context.WithCancel(context.Background())
		factory := func(context.Context, fence.Key, fence.Token) (consumer.Handler[*memfence.Tx], error) {
			cancel()
			return nil, boom
		}
		c, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](newStore(t)), nil, consumer.PerPartition(factory),
			consumer.Kafka(fastKafka(brokers)...), consumer.Logger(quiet))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		select {
		case err = <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d: Run did not return after its factory failed", round)
		}
		cancel()
		if !errors.Is(err, boom) {
			t.Fatalf("round %d: Run returned %v, want the factory's error (a fatal error during shutdown was reported as a clean stop)", round, err)
		}
	}
}
