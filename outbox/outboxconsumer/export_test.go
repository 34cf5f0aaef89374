package outboxconsumer

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/outbox"
)

// DeadLetterCopy is the function DeadLetters gives the consumer.
func DeadLetterCopy[Tx any](box outbox.Appender[Tx]) func(context.Context, Tx, *consumer.Batch, *kgo.Record) error {
	return deadLetterCopy(box)
}
