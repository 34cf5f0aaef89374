package outboxconsumer

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/outbox"
)

// Handler wraps a Baton consumer's handler with the inbox: each record of a batch is admitted
// inside the batch's fenced transaction, and only admitted records reach h (duplicates and
// stale records are dropped and counted). If nothing in a batch is admitted, h is not called and
// the batch commits with just the fence advance. A record without Baton's headers or without a
// key is a poison record ([outbox.ErrNotBaton], [outbox.ErrNoKey]): the consumer dead-letters it and goes on.
// With consumer.Lanes, h receives the prepared results of the admitted records only,
// b.Prepared[i] still b.Records[i]'s.
//
// Give the consumer [AdmitDeadLetters](in) with it: a record h refuses for good rolls back
// with its admission, and without it a re-published copy of the dead-lettered record is
// admitted again (applied as well as dead-lettered, or dead-lettered twice).
func Handler[Tx any](in *outbox.Inbox[Tx], h consumer.Handler[Tx]) consumer.Handler[Tx] {
	return func(ctx context.Context, tx Tx, b *consumer.Batch) error {
		kept := b.Records[:0:0]
		// With consumer.Lanes a batch carries Prepared[i] for Records[i]: filter them together,
		// so the wrapped handler never applies a record with another record's prepared result.
		aligned := b.Prepared != nil && len(b.Prepared) == len(b.Records)
		var prepared []any
		for i, r := range b.Records {
			v, err := in.Admit(ctx, tx, r)
			if errors.Is(err, outbox.ErrNotBaton) || errors.Is(err, outbox.ErrNoKey) {
				return b.Fail(r, err)
			}
			if err != nil {
				return err
			}
			if v == fence.Admitted {
				kept = append(kept, r)
				if aligned {
					prepared = append(prepared, b.Prepared[i])
				}
			}
		}
		if len(kept) == 0 {
			return nil
		}
		nb := *b
		nb.Records = kept
		if aligned {
			nb.Prepared = prepared
		}
		return h(ctx, tx, &nb)
	}
}

// DeadLetters is the consumer option that dead-letters a poison record through box, the
// fenced outbox, instead of producing it to Kafka (consumer.FencedDeadLetters): the dead-letter
// copy (the consumer's: the dead-letter topic, the record's key, value and headers, and the
// baton.dlq.* headers) is appended under the partition's fence key and token in the same
// transaction that advances the fence over the record, and relayed like any outbox row by the
// partition's owner (the relay of box must run: consumer.AfterCommit(relay.AfterCommit(), ...)).
// So a zombie whose transaction the database ended (idle_in_transaction_session_timeout) never
// dead-letters a record, and the copies a relay re-publishes carry the row's baton-* headers, so
// readers of the dead-letter topic deduplicate them with an outbox.Inbox or by
// baton-idempotency-key.
//
// The copy keeps the record's headers except those an outbox row may not carry (baton-*,
// traceparent, tracestate, and keys that are empty or not UTF-8): the relay sets its own, and
// baton.dlq.topic, .partition and .offset name the original record. A copy the outbox refuses
// for good (larger than the store's message bound, a dead-letter topic name Kafka refuses) is
// a consumer.Permanent error: the consumer stops the partition with an ERROR rather than skip
// the record. An option, not a wrapper: it holds whatever wraps the handler ([Handler], an
// application's middleware). A dead-letter topic that stays missing or unauthorized for the
// relay's GiveUpAfter does not stall the partition as a direct produce does: the relay sets
// the copy aside as an undeliverable row (outbox's "Undeliverable rows"). A nil box (or a
// typed nil) makes consumer.New fail with consumer.ErrInvalidOption.
func DeadLetters[Tx any](box outbox.Appender[Tx]) consumer.Option {
	if isNil(box) {
		return refused(consumer.FencedDeadLetters(deadLetterCopy(box)),
			fmt.Errorf("%w: outboxconsumer.DeadLetters with a nil outbox", consumer.ErrInvalidOption))
	}
	return consumer.FencedDeadLetters(deadLetterCopy(box))
}

// AdmitDeadLetters is the consumer option that admits a record through in, the inbox of
// [Handler], in the transaction that dead-letters it (consumer.AdmitDeadLetters): a poison
// record's admission commits with its dead letter, so a copy of it the relay re-publishes is a
// duplicate, dropped, never applied and never dead-lettered a second time; and a copy of a
// record already applied or dead-lettered that turns out poison (its lanes preparation failing
// for good, say) is dropped, not dead-lettered. A record the inbox cannot admit (without
// Baton's headers or key, or forged: [outbox.ErrNotBaton], [outbox.ErrNoKey]) is dead-lettered
// without an admission. A nil in makes consumer.New fail with consumer.ErrInvalidOption.
func AdmitDeadLetters[Tx any](in *outbox.Inbox[Tx]) consumer.Option {
	if in == nil {
		return refused(consumer.AdmitDeadLetters(admitDeadLetter(in)),
			fmt.Errorf("%w: outboxconsumer.AdmitDeadLetters with a nil inbox", consumer.ErrInvalidOption))
	}
	return consumer.AdmitDeadLetters(admitDeadLetter(in))
}

// admitDeadLetter admits r through in: AdmitDeadLetters' function.
func admitDeadLetter[Tx any](in *outbox.Inbox[Tx]) func(context.Context, Tx, *kgo.Record) (fence.Verdict, error) {
	return func(ctx context.Context, tx Tx, r *kgo.Record) (fence.Verdict, error) {
		v, err := in.Admit(ctx, tx, r)
		if errors.Is(err, outbox.ErrNotBaton) || errors.Is(err, outbox.ErrNoKey) {
			return fence.Admitted, nil // poison because the inbox cannot admit it: dead-lettered as it is
		}
		return v, err
	}
}

// refused returns an option of o's type that only fails with err: consumer.New reports err
// with its other option errors.
func refused[O ~func(C) error, C any](_ O, err error) O {
	return func(C) error { return err }
}

// isNil reports whether v is nil or holds a nil pointer, map, func, chan, slice or interface:
// a typed nil passes a == nil check and would only fail at the first poison record.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Func, reflect.Chan, reflect.Interface, reflect.Slice, reflect.UnsafePointer:
		return rv.IsNil()
	}
	return false
}

// deadLetterCopy appends the consumer's dead-letter copy d to box: DeadLetters' function.
func deadLetterCopy[Tx any](box outbox.Appender[Tx]) func(context.Context, Tx, *consumer.Batch, *kgo.Record) error {
	return func(ctx context.Context, tx Tx, b *consumer.Batch, d *kgo.Record) error {
		m := outbox.Message{Topic: d.Topic, Key: d.Key, Value: d.Value, Headers: make([]kgo.RecordHeader, 0, len(d.Headers))}
		for _, h := range d.Headers {
			if rowHeader(h.Key) {
				m.Headers = append(m.Headers, h)
			}
		}
		err := box.Append(ctx, tx, b.Key, b.Token, m)
		if errors.Is(err, outbox.ErrTooLarge) || (errors.Is(err, outbox.ErrInvalid) && !errors.Is(err, outbox.ErrUnfenced)) {
			return consumer.Permanent(err)
		}
		return err
	}
}

// rowHeader reports whether an outbox row may carry a header named k.
func rowHeader(k string) bool {
	l := strings.ToLower(k)
	return k != "" && utf8.ValidString(k) && !strings.HasPrefix(l, "baton-") &&
		l != "traceparent" && l != "tracestate"
}
