package outboxstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/propagation"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/fencecheck"
	"github.com/batonhq/baton/outbox"
)

// DefaultMaxMessageBytes is the default bound on a message's key+value+headers: just under
// Kafka's default message.max.bytes (1048588) less batch overhead, so that a row accepted at
// Append is a row the broker accepts.
const DefaultMaxMessageBytes = 1_000_000

// MaxReasonLen bounds the reason stored with a dead-lettered row (outbox.Store.DeadLetter).
const MaxReasonLen = 1024

// maxIdempotencyKeyLen bounds a caller-given idempotency key (outbox.Message.IdempotencyKey).
const maxIdempotencyKeyLen = 1024

// The W3C trace-context header names, reserved for the relay.
const (
	traceParent = "traceparent"
	traceState  = "tracestate"
)

// Bad input ValidateAppend names by its own sentinel; both wrap outbox.ErrInvalid, which is
// what callers test.
var (
	ErrNoTopic       = fmt.Errorf("%w: message has no topic", outbox.ErrInvalid)
	ErrInvalidHeader = fmt.Errorf("%w: invalid header", outbox.ErrInvalid)
)

// IdempotencyKey is the key derived for the row of src with sequence seq:
// "group/topic/partition/seq". It is unique for ever: sequences are never reused for a source
// partition.
func IdempotencyKey(src fence.Key, seq int64) string {
	return src.String() + "/" + strconv.FormatInt(seq, 10)
}

// ValidateAppend checks Append's arguments before anything is written: the source key, the
// token and every message. maxBytes bounds key+value+headers of each message. Store
// implementations call it first.
func ValidateAppend(src fence.Key, tok fence.Token, msgs []outbox.Message, maxBytes int) error {
	if err := fencecheck.ValidateKey(src); err != nil {
		return fmt.Errorf("%w: source: %w", outbox.ErrInvalid, err)
	}
	if err := fencecheck.ValidateToken(tok); err != nil {
		return fmt.Errorf("%w: %w", outbox.ErrInvalid, err)
	}
	for i := range msgs {
		if err := validateMessage(&msgs[i], maxBytes); err != nil {
			return fmt.Errorf("message %d: %w", i, err)
		}
	}
	return nil
}

// ValidateDeadLetter checks DeadLetter's arguments before any statement: the source key, the
// token, a sequence of at least 1 and a reason that is non-empty, valid UTF-8 without NUL
// bytes and at most MaxReasonLen bytes.
func ValidateDeadLetter(src fence.Key, tok fence.Token, seq int64, reason string) error {
	if err := fencecheck.ValidateKey(src); err != nil {
		return fmt.Errorf("%w: source: %w", outbox.ErrInvalid, err)
	}
	if err := fencecheck.ValidateToken(tok); err != nil {
		return fmt.Errorf("%w: %w", outbox.ErrInvalid, err)
	}
	if seq < 1 {
		return fmt.Errorf("%w: seq %d", outbox.ErrInvalid, seq)
	}
	if reason == "" || len(reason) > MaxReasonLen || !utf8.ValidString(reason) || strings.IndexByte(reason, 0) >= 0 {
		return fmt.Errorf("%w: dead-letter reason must be 1 to %d bytes of UTF-8 without NUL", outbox.ErrInvalid, MaxReasonLen)
	}
	return nil
}

func validateMessage(m *outbox.Message, maxBytes int) error {
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
		return fmt.Errorf("%w: %d bytes, limit %d", outbox.ErrTooLarge, size, maxBytes)
	}
	if m.IdempotencyKey != "" {
		if len(m.IdempotencyKey) > maxIdempotencyKeyLen || !utf8.ValidString(m.IdempotencyKey) {
			return fmt.Errorf("%w: idempotency key is longer than %d bytes or not UTF-8", outbox.ErrInvalid, maxIdempotencyKeyLen)
		}
	}
	return nil
}

// validateTopic applies Kafka's topic-name rule, so that a row is never stored that the broker
// would refuse for ever.
func validateTopic(t string) error {
	if len(t) > 249 || t == "." || t == ".." {
		return fmt.Errorf("%w: topic %q is not a legal kafka topic name", outbox.ErrInvalid, t)
	}
	for i := 0; i < len(t); i++ {
		switch c := t[i]; {
		case c == '.', c == '_', c == '-', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		default:
			return fmt.Errorf("%w: topic %q has byte %q; kafka allows [a-zA-Z0-9._-]", outbox.ErrInvalid, t, c)
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
		strings.EqualFold(k, traceParent), strings.EqualFold(k, traceState):
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
	return c[traceParent], c[traceState]
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
	bad := func(what string) error { return fmt.Errorf("%w: stored headers: %s", outbox.ErrInvalid, what) }
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
