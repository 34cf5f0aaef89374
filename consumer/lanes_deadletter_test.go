package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
)

// dlPrepHandler is a two-stage handler that also takes dead letters: Handle refuses the record
// whose value is "bad" for good; DeadLetter records the batch it is given.
type dlPrepHandler struct {
	mu         sync.Mutex
	dead       []*consumer.Batch
	violations []string
}

func (h *dlPrepHandler) Prepare(_ context.Context, r *kgo.Record) (any, error) {
	return "prepared:" + string(r.Value), nil
}

func (h *dlPrepHandler) Handle(_ context.Context, _ *memfence.Tx, b *consumer.Batch) error {
	h.mu.Lock()
	for i, r := range b.Records { // the poison split keeps Prepared[i] for Records[i]
		if len(b.Prepared) != len(b.Records) || b.Prepared[i] != "prepared:"+string(r.Value) {
			h.violations = append(h.violations, fmt.Sprintf("offset %d: prepared %v", r.Offset, b.Prepared))
		}
	}
	h.mu.Unlock()
	for _, r := range b.Records {
		if string(r.Value) == "bad" {
			return b.Fail(r, errors.New("refused by the handler"))
		}
	}
	return nil
}

func (h *dlPrepHandler) DeadLetter(_ context.Context, _ *memfence.Tx, b *consumer.Batch, _ *kgo.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dead = append(h.dead, b)
	return nil
}

func (h *dlPrepHandler) deadBatches() []*consumer.Batch {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*consumer.Batch(nil), h.dead...)
}

// A record Prepare handled and Handle refused for good is dead-lettered with its prepared
// result: the FencedDeadLetters function's Batch keeps Prepared[i] for Records[i] like Handle's (before the
// fix its Prepared was nil, and a DeadLetter indexing it panicked on the partition's goroutine).
func TestLanesDeadLetterBatchCarriesPrepared(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i, v := range []string{"1", "2", "3", "bad", "4", "5"} {
		r := &kgo.Record{Topic: "orders", Key: []byte(fmt.Sprintf("k%d", i%2)), Value: []byte(v)}
		if err := cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	s := newStore(t)
	h := &dlPrepHandler{}
	prepare := func(ctx context.Context, _ fence.Key, _ fence.Token, r *kgo.Record) (any, error) {
		return h.Prepare(ctx, r)
	}
	c, err := consumer.New("g", []string{"orders"}, s, h.Handle, consumer.Kafka(fastKafka(brokers)...),
		consumer.Logger(quiet), consumer.Lanes(2, prepare), consumer.FencedDeadLetters(h.DeadLetter))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	waitFor(t, "the refused record dead-lettered", bound(30*time.Second), func() bool { return len(h.deadBatches()) > 0 })
	waitFor(t, "every record applied", bound(30*time.Second), func() bool {
		st, err := s.Load(context.Background(), fence.Key{Group: "g", Topic: "orders", Partition: 0})
		return err == nil && st.Position == 5
	})
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	if len(h.violations) > 0 {
		t.Fatalf("Handle given misaligned results: %v", h.violations)
	}
	b := h.deadBatches()[0]
	if len(b.Records) != 1 || string(b.Records[0].Value) != "bad" {
		t.Fatalf("dead-lettered %d records, want the bad one", len(b.Records))
	}
	if len(b.Prepared) != 1 || b.Prepared[0] != "prepared:bad" {
		t.Fatalf("the dead-letter batch carries Prepared %v, want [prepared:bad]", b.Prepared)
	}
}
