package consumer

import (
	"context"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
)

// DeadLetterer is an optional interface of a [Handler]: a handler that implements it takes the
// dead-letter copy of a poison record into the fenced transaction itself, instead of the
// consumer producing it to Kafka. The consumer calls DeadLetter inside the fenced transaction
// that advances the fence over the poison record, with b holding that record alone (b.Key,
// b.Token: the partition and the token the transaction is fenced with; for a [Preparer],
// b.Prepared its result, nil if its Prepare failed for good) and d the record the
// consumer would have produced (the dead-letter topic, the poison record's key, value and
// headers, and the baton.dlq.* headers). The copy commits with the fence advance or not at
// all, so a zombie whose transaction the database ended (idle_in_transaction_session_timeout)
// never dead-letters a record. outboxconsumer.DeadLetters implements it with an append to the
// fenced outbox, relayed by the partition's owner.
//
// An error rolls the transaction back; it is retried like a handler's error, except that an
// error marked [Permanent] (a copy the handler's store can never take) stops the partition
// with an ERROR log. It is never called concurrently for the same partition.
//
// The consumer looks for DeadLetterer on the handler the factory returns, not through it: a
// wrapper around outboxconsumer.DeadLetters' handler that does not implement DeadLetterer
// itself (a [HandlerFunc], an application's middleware) silently turns dead letters back
// into direct produces, unfenced against a paused member (the "poison record dead-lettered"
// log says in_tx=false). Wrap outside-in: middleware first, DeadLetters outermost.
type DeadLetterer[Tx any] interface {
	DeadLetter(ctx context.Context, tx Tx, b *Batch, d *kgo.Record) error
}

// deadLetterRecord returns the dead-letter copy of r for topic: r's key, value and timestamp,
// and its headers followed by Baton's (deadLetterHeaders).
func deadLetterRecord(topic string, r *kgo.Record, cause error, k fence.Key, t fence.Token) *kgo.Record {
	return &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Timestamp: r.Timestamp,
		Headers: deadLetterHeaders(r, cause, k, t)}
}

// maxDeadLetterReason bounds the baton.dlq.reason header: the cause's message, cut at a rune
// boundary.
const maxDeadLetterReason = 1024

// deadLetterHeaders returns the headers of r's dead-letter copy: r's own headers without any
// baton.dlq.* header (a producer cannot forge where a record came from or why it was
// dead-lettered: every baton.dlq.* header of the copy is Baton's, exactly once), then Baton's.
func deadLetterHeaders(r *kgo.Record, cause error, k fence.Key, t fence.Token) []kgo.RecordHeader {
	hs := make([]kgo.RecordHeader, 0, len(r.Headers)+6)
	for _, h := range r.Headers {
		if !strings.HasPrefix(strings.ToLower(h.Key), "baton.dlq.") {
			hs = append(hs, h)
		}
	}
	reason := "unknown"
	if cause != nil {
		reason = cause.Error()
	}
	if len(reason) > maxDeadLetterReason {
		// A handler's error may quote the record: unbounded, the copy would be up to twice
		// the record's size, over the outbox's message bound or the producer's for a record
		// the source topic took, and the partition would stop (or stall) on it.
		n := maxDeadLetterReason
		for n > 0 && !utf8.RuneStart(reason[n]) {
			n--
		}
		reason = reason[:n]
	}
	return append(hs,
		kgo.RecordHeader{Key: HeaderDLQReason, Value: []byte(reason)},
		kgo.RecordHeader{Key: HeaderDLQGroup, Value: []byte(k.Group)},
		kgo.RecordHeader{Key: HeaderDLQTopic, Value: []byte(r.Topic)},
		kgo.RecordHeader{Key: HeaderDLQPartition, Value: []byte(strconv.Itoa(int(r.Partition)))},
		kgo.RecordHeader{Key: HeaderDLQOffset, Value: []byte(itoa(r.Offset))},
		kgo.RecordHeader{Key: HeaderDLQToken, Value: []byte(t.String())},
	)
}
