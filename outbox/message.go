package outbox

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/fencecheck"
)

// Header names the relay sets on every published record (the package doc lists them for
// receivers in other languages). Message headers may not use the "baton-" prefix or the W3C
// trace-context names.
const (
	headerToken          = "baton-token"           // the appending owner's fence.Token, text form "era.epoch"
	headerSeq            = "baton-seq"             // the per-source-partition sequence, decimal
	headerIdempotencyKey = "baton-idempotency-key" // Row.IdempotencyKey
	headerSource         = "baton-source"          // the source fence.Key, "group/topic/partition"
	headerTraceParent    = "traceparent"           // W3C trace context of the appending transaction
	headerTraceState     = "tracestate"
)

// Message is one record to publish, appended to the outbox in the transaction of the state
// change that caused it.
type Message struct {
	Topic   string // destination topic; required
	Key     []byte // record key; the inbox deduplicates per key, so give one if receivers use it
	Value   []byte
	Headers []kgo.RecordHeader
	// IdempotencyKey, if set, is published instead of the derived "group/topic/partition/seq"
	// (the source key and the row's sequence). Use it when a third party already knows the
	// operation under a key of yours. At most 1024 bytes of UTF-8.
	IdempotencyKey string
}

// Row is a stored outbox message with the stamps the store added. Store implementations build
// Rows; the relay publishes them.
type Row struct {
	Message
	Source         fence.Key   // the partition whose owner appended the row
	Token          fence.Token // the owner's token at Append
	Seq            int64       // 1, 2, 3... per Source, gap-free, in commit order
	IdempotencyKey string      // Message.IdempotencyKey or the derived one
	TraceParent    string      // W3C trace context captured at Append ("" if none)
	TraceState     string
	CreatedAt      time.Time // the store's clock at Append; commit->ack latency is measured from it
}

// DeadRow is an outbox row the relay gave up on ([Store.DeadLetter]), as the store keeps it
// for an operator: the row, why, and which owner dead-lettered it when. Reason starts with one
// of the labels of the baton.outbox.dead_lettered metric: message_too_large,
// record_list_too_large and invalid_record (the broker refused the record produced alone: kerr.MessageTooLarge,
// RecordListTooLarge, InvalidRecord), unknown_topic and topic_authorization_failed (the topic
// stayed missing, or unauthorized, for GiveUpAfter).
type DeadRow struct {
	Row
	Reason string      // the reason label (listed above) and the broker's error
	By     fence.Token // the token of the owner whose relay dead-lettered it
	At     time.Time   // when (the store's clock)
}

// parseSource parses the "group/topic/partition" form of [fence.Key.String]. It splits from the
// right: Kafka topic names cannot contain '/', so only the group may, and the form is
// unambiguous.
func parseSource(s string) (fence.Key, error) {
	i := strings.LastIndexByte(s, '/')
	if i < 0 {
		return fence.Key{}, fmt.Errorf("%w: source %q", ErrNotBaton, s)
	}
	p, err := strconv.ParseInt(s[i+1:], 10, 32)
	if err != nil {
		return fence.Key{}, fmt.Errorf("%w: source %q: partition: %v", ErrNotBaton, s, err)
	}
	j := strings.LastIndexByte(s[:i], '/')
	if j < 0 {
		return fence.Key{}, fmt.Errorf("%w: source %q", ErrNotBaton, s)
	}
	k := fence.Key{Group: s[:j], Topic: s[j+1 : i], Partition: int32(p)}
	if err := fencecheck.ValidateKey(k); err != nil || k.String() != s {
		return fence.Key{}, fmt.Errorf("%w: source %q is not group/topic/partition", ErrNotBaton, s)
	}
	return k, nil
}
