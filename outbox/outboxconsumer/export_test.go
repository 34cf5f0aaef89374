package outboxconsumer

import (
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/outbox"
)

// DeadLetterCopy is the function DeadLetters gives the consumer.
func DeadLetterCopy[Tx any](box outbox.Appender[Tx]) consumer.DeadLetterFunc[Tx] {
	return deadLetterCopy(box)
}
