package outboxconsumer

import (
	"context"
	"errors"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/outbox"
)

// Handler wraps a Baton consumer's handler with the inbox: each record of a batch is admitted
// inside the batch's fenced transaction, and only admitted records reach h (duplicates and
// stale records are dropped and counted). If nothing in a batch is admitted, h is not called and
// the batch commits with just the fence advance. A record without Baton's headers or without a
// key is a poison record ([outbox.ErrNotBaton], [outbox.ErrNoKey]): the consumer dead-letters it and goes on.
func Handler[Tx any](in *outbox.Inbox[Tx], h consumer.Handler[Tx]) consumer.Handler[Tx] {
	return consumer.HandlerFunc[Tx](func(ctx context.Context, tx Tx, b *consumer.Batch) error {
		kept := b.Records[:0:0]
		for _, r := range b.Records {
			v, err := in.Admit(ctx, tx, r)
			if errors.Is(err, outbox.ErrNotBaton) || errors.Is(err, outbox.ErrNoKey) {
				return b.Fail(r, err)
			}
			if err != nil {
				return err
			}
			if v == fence.Admitted {
				kept = append(kept, r)
			}
		}
		if len(kept) == 0 {
			return nil
		}
		nb := *b
		nb.Records = kept
		return h.Handle(ctx, tx, &nb)
	})
}
