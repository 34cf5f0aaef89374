package main

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// A handover bench member builds its consumer from its own Kafka options: consumer.New must
// accept them, or every member exits at once and the bench measures nothing. The member is
// given a broker address nobody listens on and stopped after a moment: what it returns is
// consumer.New's verdict on its options, or the cancellation of a consumer that started.
func TestBenchHandoverMemberOptionsAccepted(t *testing.T) {
	pg := testenv.PostgresURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := handoverWorker(ctx, []string{"-brokers", "127.0.0.1:1", "-postgres", pg, "-topic", "bench-handover-options",
		"-group", "bench-handover-options", "-name", "m1"}, io.Discard, io.Discard)
	if errors.Is(err, consumer.ErrInvalidOption) {
		t.Fatalf("the member's consumer was refused: %v", err)
	}
}
