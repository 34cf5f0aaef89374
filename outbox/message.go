package outbox

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/propagation"

	"github.com/batonhq/baton/fence"
)

// Header names the relay sets on every published record. Message headers may not use the
// "baton-" prefix or the W3C trace-context names.
const (
	HeaderToken          = "baton-token"           // the appending owner's fence.Token, text form "era.epoch"
	HeaderSeq            = "baton-seq"             // the per-source-partition sequence, decimal
	HeaderIdempotencyKey = "baton-idempotency-key" // Row.IdempotencyKey
	HeaderSource         = "baton-source"          // the source fence.Key, "group/topic/partition"
	HeaderTraceParent    = "traceparent"           // W3C trace context of the appending transaction
	HeaderTraceState     = "tracestate"
)

// DefaultMaxMessageBytes is the default bound on a message's key+value+headers: just under
// Kafka's default message.max.bytes (1048588) less batch overhead, so that a row accepted at
// Append is a row the broker accepts.
const DefaultMaxMessageBytes = 1_000_000

// MaxIdempotencyKeyLen bounds a caller-given idempotency key.
const MaxIdempotencyKeyLen = 1024

// Message is one record to publish, appended to the outbox in the transaction of the state
// change that caused it.
type Message struct {
	Topic   string // destination topic; required
	Key     []byte // record key; the inbox deduplicates per key, so give one if receivers use it
	Value   []byte
	Headers []kgo.RecordHeader
	// IdempotencyKey, if set, is published instead of the derived "group/topic/partition/seq".
	// Use it when a third party already knows the operation under a key of yours.
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

// IdempotencyKey is the key derived for the row of src with sequence seq: "group/topic/partition/seq".
// It is unique for ever: sequences are never reused for a source partition.
func IdempotencyKey(src fence.Key, seq int64) string {
	return src.String() + "/" + strconv.FormatInt(seq, 10)
}

// ValidateAppend checks Append's arguments before anything is written: the source key, the
// token and every message. maxBytes bounds key+value+headers of each message. Store
// implementations call it first.
func ValidateAppend(src fence.Key, tok fence.Token, msgs []Message, maxBytes int) error {
	if err := src.Validate(); err != nil {
		return fmt.Errorf("%w: source: %w", ErrInvalid, err)
	}
	if err := tok.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	for i := range msgs {
		if err := validateMessage(&msgs[i], maxBytes); err != nil {
			return fmt.Errorf("message %d: %w", i, err)
		}
	}
	return nil
}

func validateMessage(m *Message, maxBytes int) error {
	if m.Topic == "" {
		return ErrNoTopic
	}
	if err := validateTopic(m.Topic); err != nil {
		return err
	}
	size := len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		if err := validateHeaderKey(h.Key); err != nil {
			return err
		}
		size += len(h.Key) + len(h.Value)
	}
	if size > maxBytes {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, size, maxBytes)
	}
	if m.IdempotencyKey != "" {
		if len(m.IdempotencyKey) > MaxIdempotencyKeyLen || !utf8.ValidString(m.IdempotencyKey) {
			return fmt.Errorf("%w: idempotency key is longer than %d bytes or not UTF-8", ErrInvalid, MaxIdempotencyKeyLen)
		}
	}
	return nil
}

// validateTopic applies Kafka's topic-name rule, so that a row is never stored that the broker
// would refuse for ever.
func validateTopic(t string) error {
	if len(t) > 249 || t == "." || t == ".." {
		return fmt.Errorf("%w: topic %q is not a legal kafka topic name", ErrInvalid, t)
	}
	for i := 0; i < len(t); i++ {
		switch c := t[i]; {
		case c == '.', c == '_', c == '-', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		default:
			return fmt.Errorf("%w: topic %q has byte %q; kafka allows [a-zA-Z0-9._-]", ErrInvalid, t, c)
		}
	}
	return nil
}

func validateHeaderKey(k string) error {
	switch {
	case k == "":
		return fmt.Errorf("%w: empty key", ErrInvalidHeader)
	case !utf8.ValidString(k):
		return fmt.Errorf("%w: key %q is not UTF-8", ErrInvalidHeader, k)
	case len(k) >= 6 && strings.EqualFold(k[:6], "baton-"),
		strings.EqualFold(k, HeaderTraceParent), strings.EqualFold(k, HeaderTraceState):
		return fmt.Errorf("%w: key %q is reserved for the relay", ErrInvalidHeader, k)
	}
	return nil
}

// TraceContext returns the W3C traceparent and tracestate of the span in ctx, as p writes them
// ("" if ctx carries no span). Stores call it at Append to link the outbox row to the state
// change's trace; the relay continues that trace when it publishes the row.
func TraceContext(ctx context.Context, p propagation.TextMapPropagator) (traceparent, tracestate string) {
	c := propagation.MapCarrier{}
	p.Inject(ctx, c)
	return c[HeaderTraceParent], c[HeaderTraceState]
}

// MarshalHeaders encodes message headers for storage: a uvarint count, then per header a
// uvarint key length, the key, a varint value length (-1 for a nil value) and the value.
// It returns nil for no headers.
func MarshalHeaders(hs []kgo.RecordHeader) []byte {
	if len(hs) == 0 {
		return nil
	}
	b := binary.AppendUvarint(nil, uint64(len(hs)))
	for _, h := range hs {
		b = binary.AppendUvarint(b, uint64(len(h.Key)))
		b = append(b, h.Key...)
		if h.Value == nil {
			b = binary.AppendVarint(b, -1)
			continue
		}
		b = binary.AppendVarint(b, int64(len(h.Value)))
		b = append(b, h.Value...)
	}
	return b
}

// UnmarshalHeaders decodes what [MarshalHeaders] wrote.
func UnmarshalHeaders(b []byte) ([]kgo.RecordHeader, error) {
	if len(b) == 0 {
		return nil, nil
	}
	bad := func(what string) error { return fmt.Errorf("%w: stored headers: %s", ErrInvalid, what) }
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) { // every header takes at least two bytes
		return nil, bad("bad count")
	}
	b = b[k:]
	hs := make([]kgo.RecordHeader, 0, n)
	for range n {
		kl, k := binary.Uvarint(b)
		if k <= 0 || kl > uint64(len(b)-k) {
			return nil, bad("bad key length")
		}
		key := string(b[k : k+int(kl)])
		b = b[k+int(kl):]
		vl, k := binary.Varint(b)
		if k <= 0 || vl < -1 || vl > int64(len(b)-k) {
			return nil, bad("bad value length")
		}
		b = b[k:]
		var val []byte
		if vl >= 0 {
			val = append([]byte{}, b[:vl]...)
			b = b[vl:]
		}
		hs = append(hs, kgo.RecordHeader{Key: key, Value: val})
	}
	if len(b) != 0 {
		return nil, bad("trailing bytes")
	}
	return hs, nil
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
	if err := k.Validate(); err != nil || k.String() != s {
		return fence.Key{}, fmt.Errorf("%w: source %q is not group/topic/partition", ErrNotBaton, s)
	}
	return k, nil
}
