package outbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/fencecheck"
)

// Inbox deduplicates relayed records at a receiver, atomically with the receiver's own write:
// inside the receiver's transaction it admits a record only if its (token, seq) is higher than
// anything admitted before for the same (receiver, source partition, destination topic and
// partition the record was read from, record key), through a [fence.KeyedSink] stored next to
// the receiver's data. Safe for concurrent use.
type Inbox[Tx any] struct {
	name  string
	keyed fence.KeyedSink[Tx]
	tel   *telemetry
	keys  [][]byte // SigningKeys: a record must verify under one of them; nil trusts the topic
}

// NewInbox returns an inbox named name (the receiver: one name per logical consumer of the
// records, stable across restarts) over keyed.
func NewInbox[Tx any](name string, keyed fence.KeyedSink[Tx], opts ...Option) (*Inbox[Tx], error) {
	if err := fencecheck.ValidateIdentifier("inbox name", name); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if keyed == nil {
		return nil, fmt.Errorf("%w: nil keyed sink", ErrInvalid)
	}
	c, err := newConfig(opts, func(o Option, c *config) error { return o(c) })
	if err != nil {
		return nil, err
	}
	tel, err := c.build()
	if err != nil {
		return nil, fmt.Errorf("outbox: instruments: %w", err)
	}
	return &Inbox[Tx]{name: name, keyed: keyed, tel: tel, keys: c.keys}, nil
}

// Envelope is what the relay's headers say about a record.
type Envelope struct {
	Source         fence.Key
	Token          fence.Token
	Seq            int64
	IdempotencyKey string
}

// ParseEnvelope reads the baton headers of rec. It fails with [ErrNotBaton] if one is missing
// or malformed.
func ParseEnvelope(rec *kgo.Record) (Envelope, error) {
	var e Envelope
	tv, ok1 := header(rec, headerToken)
	sv, ok2 := header(rec, headerSeq)
	src, ok3 := header(rec, headerSource)
	if !ok1 || !ok2 || !ok3 {
		return e, fmt.Errorf("%w: %s, %s and %s are required", ErrNotBaton, headerToken, headerSeq, headerSource)
	}
	var err error
	if e.Token, err = fence.ParseToken(string(tv)); err != nil {
		return e, fmt.Errorf("%w: %s: %w", ErrNotBaton, headerToken, err)
	}
	if e.Seq, err = strconv.ParseInt(string(sv), 10, 64); err != nil || e.Seq < 1 {
		return e, fmt.Errorf("%w: %s %q", ErrNotBaton, headerSeq, sv)
	}
	if e.Source, err = parseSource(string(src)); err != nil {
		return e, err
	}
	if ik, ok := header(rec, headerIdempotencyKey); ok {
		e.IdempotencyKey = string(ik)
	}
	return e, nil
}

// Admit decides, inside the receiver's transaction tx, whether rec's effect must be applied:
// [fence.Admitted] (apply it, then commit: the admission commits with it), [fence.Duplicate]
// (this record or a later one of the same owner was applied: a relay re-publish) or
// [fence.Stale] (an older owner's record after a newer owner's: a zombie's). The entity row
// stays locked until tx ends, so concurrent receivers of the same key serialize.
//
// The scope is the inbox name, the source partition and the destination topic and partition
// rec was read from (rec.Topic, rec.Partition); the id is the record key. So per key, the
// records of one source partition in one destination partition are admitted in (token, seq)
// order, which is the order Kafka gives them: reading several destination topics or
// partitions in any interleaving never drops a record that was not applied (see the package
// documentation, "Admission scope"). Records without the baton headers fail with
// [ErrNotBaton], keyless ones with [ErrNoKey], ones without a topic or with a negative
// partition (not read from Kafka) with [ErrInvalid]; with [SigningKeys], a record whose
// baton-signature does not verify fails with [ErrBadSignature] (and ErrNotBaton) and is counted
// in baton.inbox.drops (reason "forged") before the keyed fence is touched; store errors are
// returned as they are, and the caller must roll back on any error.
func (in *Inbox[Tx]) Admit(ctx context.Context, tx Tx, rec *kgo.Record) (fence.Verdict, error) {
	if rec == nil {
		return 0, fmt.Errorf("%w: nil record", ErrInvalid)
	}
	if in.keys != nil {
		if err := verify(in.keys, rec); err != nil {
			in.tel.drops.Add(ctx, 1, metric.WithAttributes(attribute.String("baton.inbox", in.name), attribute.String("reason", "forged")))
			return 0, err
		}
	}
	env, err := ParseEnvelope(rec)
	if err != nil {
		return 0, err
	}
	if len(rec.Key) == 0 {
		return 0, ErrNoKey
	}
	if rec.Topic == "" || rec.Partition < 0 {
		return 0, fmt.Errorf("%w: record has no topic or partition (topic %q, partition %d): the inbox scopes admissions by where a record was read", ErrInvalid, rec.Topic, rec.Partition)
	}
	carrier := propagation.MapCarrier{}
	if tp, ok := header(rec, headerTraceParent); ok {
		carrier[headerTraceParent] = string(tp)
		if ts, ok := header(rec, headerTraceState); ok {
			carrier[headerTraceState] = string(ts)
		}
	}
	ctx, span := in.tel.tracer.Start(in.tel.prop.Extract(ctx, carrier), "inbox admit "+rec.Topic,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("baton.inbox", in.name),
			attribute.String("baton.outbox.source", env.Source.String()),
			attribute.Int64("baton.outbox.seq", env.Seq),
		))
	defer span.End()
	v, err := in.keyed.Admit(ctx, tx, admissionScope(in.name, env.Source, rec.Topic, rec.Partition), entityID(rec.Key), env.Token, env.Seq)
	if err != nil {
		span.RecordError(err)
		return 0, err
	}
	span.SetAttributes(attribute.String("baton.inbox.verdict", v.String()))
	attrs := metric.WithAttributes(attribute.String("baton.inbox", in.name))
	switch v {
	case fence.Admitted:
		in.tel.admitted.Add(ctx, 1, attrs)
	case fence.Duplicate, fence.Stale:
		in.tel.drops.Add(ctx, 1, metric.WithAttributes(attribute.String("baton.inbox", in.name), attribute.String("reason", v.String())))
	}
	return v, nil
}

// admissionScope is the keyed-fence scope of the records of src read from (topic, partition)
// by the inbox named name: "name|group/topic/partition|topic/partition". A scope longer than
// fencecheck.MaxIdentifierLen (long group and topic names) is replaced by "h:" and its SHA-256; the
// readable form always contains "|", the hashed one never, so the two cannot collide.
func admissionScope(name string, src fence.Key, topic string, partition int32) string {
	s := name + "|" + src.String() + "|" + topic + "/" + strconv.FormatInt(int64(partition), 10)
	if len(s) > fencecheck.MaxIdentifierLen || !utf8.ValidString(s) {
		sum := sha256.Sum256([]byte(s))
		return "h:" + hex.EncodeToString(sum[:])
	}
	return s
}

// entityID maps a record key to a keyed-fence id, which must be UTF-8 without NUL and at most
// fencecheck.MaxIdentifierLen bytes: "k:" and the key itself (UTF-8 without NUL, up to 512
// bytes), "x:" and its hex (other keys up to maxHexKey bytes, whose hex fits), or "h:" and
// the hex of its SHA-256 (longer keys). The prefixes keep the three forms from colliding.
func entityID(key []byte) string {
	switch {
	case len(key) > 512:
		return hashedID(key)
	case utf8.Valid(key) && bytes.IndexByte(key, 0) < 0:
		return "k:" + string(key)
	case len(key) > maxHexKey:
		return hashedID(key)
	default:
		return "x:" + hex.EncodeToString(key)
	}
}

// maxHexKey is the longest key whose "x:" form fits in an id. It is part of the ids' stored
// format: fixed, not derived from the limit (a lower limit must not move keys between forms).
const maxHexKey = 511

// The "x:" form of the longest hex key fits in an id (a compile-time check).
var _ [fencecheck.MaxIdentifierLen - len("x:") - 2*maxHexKey]struct{}

func hashedID(key []byte) string {
	sum := sha256.Sum256(key)
	return "h:" + hex.EncodeToString(sum[:])
}
