package outbox

import (
	"context"
	"errors"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/partition"
)

// AfterCommit returns the hook that makes a Baton consumer of group relay each partition's
// outbox rows from the partition's own goroutine, under its token, after every committed batch
// and every idle interval:
//
//	consumer.New(group, topics, sink, factory, consumer.AfterCommit(relay.AfterCommit(group), time.Second))
//
// So the relay of source partition p runs exactly where p's ownership lives, and stops the
// moment p is revoked or lost.
func (r *Relay) AfterCommit(group string) consumer.AfterCommitFunc {
	return func(ctx context.Context, p partition.ID, t fence.Token) error {
		_, err := r.Flush(ctx, p.Key(group), t)
		return err
	}
}

// Handler wraps a Baton consumer's handler with the inbox: each record of a batch is admitted
// inside the batch's fenced transaction, and only admitted records reach h (duplicates and
// stale records are dropped and counted). If nothing in a batch is admitted, h is not called and
// the batch commits with just the fence advance. A record without Baton's headers or without a
// key is a poison record ([ErrNotBaton], [ErrNoKey]): the consumer dead-letters it and goes on.
func Handler[Tx any](in *Inbox[Tx], h consumer.Handler[Tx]) consumer.Handler[Tx] {
	return consumer.HandlerFunc[Tx](func(ctx context.Context, tx Tx, b *consumer.Batch) error {
		kept := b.Records[:0:0]
		for _, r := range b.Records {
			v, err := in.Admit(ctx, tx, r)
			if errors.Is(err, ErrNotBaton) || errors.Is(err, ErrNoKey) {
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
