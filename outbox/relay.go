package outbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/fencecheck"
)

// Store is what the relay needs from an outbox store (pgoutbox.Store, sqliteoutbox.Store).
// Both methods are fenced: they succeed only while the fence of src stores exactly tok.
type Store interface {
	// Pending returns up to limit undelivered rows of src in sequence order. It fails with a
	// *fence.StaleError if the fence stores a higher token, with ErrUnfenced if it stores
	// another one.
	Pending(ctx context.Context, src fence.Key, tok fence.Token, limit int) ([]Row, error)

	// MarkDelivered records that every row of src up to and including seq through was
	// acknowledged by the broker, in one conditional write under src's fence: it fails, and
	// marks nothing, unless the fence stores exactly tok when the write commits. It returns the
	// rows still pending.
	MarkDelivered(ctx context.Context, src fence.Key, tok fence.Token, through int64) (backlog int64, err error)

	// DeadLetter records that row seq of src will never be delivered, with reason (1 to
	// 1024 bytes of UTF-8), and moves past it, in one conditional write under src's
	// fence like MarkDelivered: it fails, and changes nothing, unless the fence stores exactly
	// tok when the write commits (a *fence.StaleError or ErrUnfenced, as for Pending) and seq is
	// the first pending row (ErrInvalid otherwise: earlier rows must be delivered or
	// dead-lettered first, so order holds). The row is kept, with the reason, where an operator
	// finds it; Pending never returns it again and its sequence is never handed out again. It
	// returns the rows still pending.
	DeadLetter(ctx context.Context, src fence.Key, tok fence.Token, seq int64, reason string) (backlog int64, err error)
}

// defaultBatchSize is the default number of rows a relay publishes before marking them.
const defaultBatchSize = 1000

// defaultFlushTimeout is the default bound on one [Relay.Flush] (see [FlushTimeout]).
const defaultFlushTimeout = 5 * time.Second

// defaultGiveUpAfter is the default time a row must stay undeliverable for a missing topic or a
// missing authorization before the relay dead-letters it (see [GiveUpAfter]).
const defaultGiveUpAfter = 10 * time.Minute

// Dead-letter reasons: the label of baton.outbox.dead_lettered and the first word of the
// reason stored with the row (DeadRow.Reason lists them).
const (
	reasonMessageTooLarge    = "message_too_large"          // kerr.MessageTooLarge: the record alone exceeds the topic's max.message.bytes (or the client's ProducerBatchMaxBytes)
	reasonRecordListTooLarge = "record_list_too_large"      // kerr.RecordListTooLarge, the record produced alone
	reasonInvalidRecord      = "invalid_record"             // kerr.InvalidRecord (e.g. a keyless record to a compacted topic), the record produced alone
	reasonUnknownTopic       = "unknown_topic"              // the topic stayed missing in metadata for GiveUpAfter
	reasonTopicAuthorization = "topic_authorization_failed" // kerr.TopicAuthorizationFailed for GiveUpAfter
	minConfirmations         = 3                            // flushes that must see a missing topic or ACL before a row is given up
	metadataReserve          = time.Second                  // the part of a flush kept for the metadata check
	maxReasonDetail          = 512
)

// Relay publishes outbox rows to Kafka under the source partition's fence. See the package
// documentation for the protocol. Flush is safe for concurrent use for different source
// partitions; calls for the same partition should come from its owner's worker, one at a time
// (concurrent calls stay safe, they only publish duplicates).
type Relay struct {
	client      *kgo.Client
	store       Store
	batch       int
	timeout     time.Duration
	giveUpAfter time.Duration
	tel         *telemetry
	sign        []byte // SigningKeys' first key, or nil

	mu      sync.Mutex
	stuck   map[fence.Key]stuckRow // per source partition: its first row whose failure may be permanent
	failing map[fence.Key]int64    // per source partition: the seq the last flush could not deliver
}

// stuckRow is a row whose failure may be permanent but must persist before it is given up.
type stuckRow struct {
	seq    int64
	reason string
	since  time.Time
	seen   int
}

type config struct {
	telemetryConfig
	batch       int
	timeout     time.Duration
	giveUpAfter time.Duration
	keys        [][]byte // SigningKeys
}

// Option configures a relay ([NewRelay]) or an inbox ([NewInbox]): [Telemetry] and
// [SigningKeys] apply to both.
type Option func(*config) error

// RelayOption configures a relay: an [Option], or one of the relay's own ([BatchSize],
// [FlushTimeout], [GiveUpAfter]), which [NewInbox] does not take.
type RelayOption interface {
	relay(*config) error
}

func (o Option) relay(c *config) error { return o(c) }

// relayOnly is an option of relays alone.
type relayOnly func(*config) error

func (o relayOnly) relay(c *config) error { return o(c) }

// BatchSize sets how many rows a relay publishes, waits for and marks at a time (default
// 1000). A larger batch amortizes the marking write; a crash re-publishes at
// most one batch.
func BatchSize(n int) RelayOption {
	return relayOnly(func(c *config) error {
		if n < 1 {
			return fmt.Errorf("%w: batch size %d", ErrInvalid, n)
		}
		c.batch = n
		return nil
	})
}

// FlushTimeout bounds each [Relay.Flush] (default 5s), and so how long the
// relay holds up a consumer's partition after each batch ([Relay.AfterCommit]): when it
// passes, Flush returns [ErrFlushTimeout], the rows not yet acknowledged stay pending, and the
// next Flush (after the next batch, or the idle interval) goes on from the first of them.
// Rows acknowledged before it passed are marked delivered. Part of it (up to a second) is kept
// for the metadata check of a possibly missing topic.
func FlushTimeout(d time.Duration) RelayOption {
	return relayOnly(func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: flush timeout %v", ErrInvalid, d)
		}
		c.timeout = d
		return nil
	})
}

// GiveUpAfter sets how long a row must keep failing for a reason that an operator may still
// fix before the relay dead-letters it (default 10 minutes): its destination topic
// missing (confirmed by a metadata request at each of at least 3 flushes over that time, so a
// topic being created is not given up on), or kerr.TopicAuthorizationFailed (an ACL not yet
// granted). The time is counted by this relay from the first failure it saw, so a restart
// starts it again. Errors that only the row can cause (too large, invalid) are dead-lettered
// at once, after the row alone was refused again.
func GiveUpAfter(d time.Duration) RelayOption {
	return relayOnly(func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: give-up time %v", ErrInvalid, d)
		}
		c.giveUpAfter = d
		return nil
	})
}

// Telemetry sets where the relay's or inbox's OpenTelemetry signals go: its metrics (meters),
// and the relay's publish spans and the inbox's admit spans (tracers). A nil argument keeps its
// default: the OpenTelemetry globals (otel.GetMeterProvider(), otel.GetTracerProvider()).
func Telemetry(meters metric.MeterProvider, tracers trace.TracerProvider) Option {
	return func(c *config) error {
		if meters != nil {
			c.meters = meters
		}
		if tracers != nil {
			c.tracers = tracers
		}
		return nil
	}
}

// NewRelay returns a relay publishing store's rows with client. The client must keep
// franz-go's default idempotent producer (NewRelay fails with [ErrInvalid] if it was
// disabled): it keeps each destination partition in produce order across retries, and fails
// every buffered record of a partition after one fails, so a batch is delivered as a prefix.
// The client may be shared (the consumer's own client works); the relay never closes it.
func NewRelay(client *kgo.Client, store Store, opts ...RelayOption) (*Relay, error) {
	if client == nil || store == nil {
		return nil, fmt.Errorf("%w: nil client or store", ErrInvalid)
	}
	if v, _ := client.OptValue(kgo.DisableIdempotentWrite).(bool); v {
		return nil, fmt.Errorf("%w: the relay's kafka client must produce idempotently (kgo.DisableIdempotentWrite is set)", ErrInvalid)
	}
	c, err := newConfig(opts, RelayOption.relay)
	if err != nil {
		return nil, err
	}
	tel, err := c.build()
	if err != nil {
		return nil, fmt.Errorf("outbox: instruments: %w", err)
	}
	r := &Relay{client: client, store: store, batch: c.batch, timeout: c.timeout, giveUpAfter: c.giveUpAfter,
		tel: tel, stuck: map[fence.Key]stuckRow{}, failing: map[fence.Key]int64{}}
	if len(c.keys) > 0 {
		r.sign = c.keys[0]
	}
	return r, nil
}

// Flush publishes every pending row of src, in sequence order, batch by batch: it produces a
// batch, waits until the broker acknowledged it, then marks the acknowledged prefix delivered
// with a write conditional on src's fence still storing tok. It returns the number of rows
// delivered and marked. It returns within [FlushTimeout].
//
// A row the broker refuses for good is dead-lettered (Store.DeadLetter, under the same fence)
// and Flush goes on with the next row: at once when the error can only come from the row and
// the row alone is refused again (kerr.MessageTooLarge, kerr.RecordListTooLarge,
// kerr.InvalidRecord), after [GiveUpAfter] when an operator may still fix it (the destination
// topic missing, confirmed by metadata; kerr.TopicAuthorizationFailed). Every other error is
// transient: the row stays pending. See the package documentation, "Undeliverable rows".
//
// Errors: a *fence.StaleError (errors.Is fence.ErrStale) or [ErrUnfenced] when tok no longer
// (or never) owns src: stop relaying src. [ErrFlushTimeout]: the timeout passed; the rows not
// acknowledged stay pending. A produce error (broker unreachable, ctx cancelled,
// kgo.RecordDeliveryTimeout): the rows from the first unacknowledged one stay pending and the
// next Flush re-publishes them, so nothing is lost or reordered; receivers drop the copies
// already delivered through the inbox.
func (r *Relay) Flush(ctx context.Context, src fence.Key, tok fence.Token) (int, error) {
	if err := fencecheck.ValidateKey(src); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	parent := ctx
	timeout := r.timeout
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, ErrFlushTimeout)
	defer cancel()
	// Produces end earlier than the flush, so that the metadata check of a topic that may be
	// missing (franz-go waits for a missing topic longer than a flush lasts) still fits.
	produceCtx, cancelProduce := context.WithTimeoutCause(ctx, timeout-min(timeout/4, metadataReserve), ErrFlushTimeout)
	defer cancelProduce()
	attrs := sourceAttrs(src)
	n := 0
	for {
		rows, err := r.store.Pending(ctx, src, tok, r.batch)
		if err != nil {
			return n, r.flushErr(parent, produceCtx, err)
		}
		if len(rows) == 0 {
			r.tel.oldest.Record(ctx, 0, attrs)
			r.clearStuck(src)
			return n, nil
		}
		if created := rows[0].CreatedAt; !created.IsZero() {
			r.tel.oldest.Record(ctx, max(0, time.Since(created).Seconds()), attrs)
		}
		read := len(rows)
		if r.failedBefore(src, rows[0].Seq) {
			// The last flush stopped at this row: try it alone first, so that a row that
			// keeps failing does not re-publish the rows behind it at every flush.
			rows = rows[:1]
		}
		errs := r.publish(produceCtx, rows)
		acked := 0
		for acked < len(rows) && errs[acked] == nil {
			acked++
		}
		if acked > 0 {
			backlog, err := r.store.MarkDelivered(ctx, src, tok, rows[acked-1].Seq)
			if err != nil {
				return n, r.flushErr(parent, produceCtx, err)
			}
			n += acked
			r.tel.delivered.Add(ctx, int64(acked), attrs)
			r.tel.backlog.Record(ctx, backlog, attrs)
			if acked == len(rows) {
				r.clearStuck(src)
				if backlog == 0 {
					r.tel.oldest.Record(ctx, 0, attrs)
					return n, nil
				}
				if read < r.batch && len(rows) == read {
					return n, nil
				}
				continue
			}
		}
		row, perr := &rows[acked], errs[acked]
		r.setFailing(src, row.Seq)
		reason, alone := r.permanent(ctx, produceCtx, src, row, perr)
		if alone {
			// Refused in its batch but delivered alone: mark it and go on.
			backlog, err := r.store.MarkDelivered(ctx, src, tok, row.Seq)
			if err != nil {
				return n, r.flushErr(parent, produceCtx, err)
			}
			n++
			r.tel.delivered.Add(ctx, 1, attrs)
			r.tel.backlog.Record(ctx, backlog, attrs)
			r.clearStuck(src)
			continue
		}
		if reason == "" {
			return n, r.flushErr(parent, produceCtx, fmt.Errorf("outbox: publishing %s seq %d..%d: %w", src, row.Seq, rows[len(rows)-1].Seq, perr))
		}
		detail := reason + ": " + perr.Error()
		if len(detail) > maxReasonDetail {
			detail = strings.ToValidUTF8(detail[:maxReasonDetail], "")
		}
		backlog, err := r.store.DeadLetter(ctx, src, tok, row.Seq, strings.ReplaceAll(detail, "\x00", ""))
		if err != nil {
			return n, r.flushErr(parent, produceCtx, err)
		}
		r.clearStuck(src)
		r.tel.deadLettered.Add(ctx, 1, metric.WithAttributes(
			attribute.String("baton.group", src.Group),
			attribute.String("messaging.source.name", src.Topic),
			attribute.Int("messaging.source.partition.id", int(src.Partition)),
			attribute.String("messaging.destination.name", row.Topic),
			attribute.String("reason", reason)))
		r.tel.backlog.Record(ctx, backlog, attrs)
	}
}

// flushErr reports err, wrapped in [ErrFlushTimeout] if the flush's own timeout (not the
// caller's ctx) ended its produces.
func (r *Relay) flushErr(parent, produceCtx context.Context, err error) error {
	if parent.Err() == nil && errors.Is(context.Cause(produceCtx), ErrFlushTimeout) && !errors.Is(err, ErrFlushTimeout) {
		return fmt.Errorf("%w after %v: %w", ErrFlushTimeout, r.timeout, err)
	}
	return err
}

// permanent returns the dead-letter reason of row, whose publish failed with perr, or "" if
// the row may still be delivered; delivered reports that the row, produced alone to decide,
// was acknowledged. produceCtx bounds that produce.
func (r *Relay) permanent(ctx, produceCtx context.Context, src fence.Key, row *Row, perr error) (reason string, delivered bool) {
	switch {
	case errors.Is(perr, kerr.MessageTooLarge):
		reason = reasonMessageTooLarge
	case errors.Is(perr, kerr.RecordListTooLarge):
		reason = reasonRecordListTooLarge
	case errors.Is(perr, kerr.InvalidRecord):
		reason = reasonInvalidRecord
	case errors.Is(perr, kerr.TopicAuthorizationFailed):
		return r.persists(src, row.Seq, reasonTopicAuthorization), false
	case errors.Is(perr, kerr.UnknownTopicOrPartition), errors.Is(perr, kerr.UnknownTopicID),
		errors.Is(perr, context.DeadlineExceeded) && errors.Is(context.Cause(produceCtx), ErrFlushTimeout):
		// franz-go waits for a missing topic to appear for longer than a flush lasts, so a
		// produce that timed out may be one; only metadata can tell.
		missing, err := r.topicMissing(ctx, row.Topic)
		if err != nil || !missing {
			r.clearStuck(src)
			return "", false // not confirmed: transient
		}
		return r.persists(src, row.Seq, reasonUnknownTopic), false
	default:
		r.clearStuck(src)
		return "", false
	}
	// The error may be the batch's rather than the row's (a broker refuses a whole record
	// batch that is too large): only the row produced alone decides. Everything before it
	// is marked, so producing it alone keeps the order.
	if produceCtx.Err() != nil {
		return "", false
	}
	res := r.client.ProduceSync(produceCtx, r.record(produceCtx, row))
	err := res.FirstErr()
	switch {
	case err == nil:
		return "", true
	case reason == reasonMessageTooLarge && errors.Is(err, kerr.MessageTooLarge),
		reason == reasonRecordListTooLarge && errors.Is(err, kerr.RecordListTooLarge),
		reason == reasonInvalidRecord && errors.Is(err, kerr.InvalidRecord):
		return reason, false
	}
	return "", false
}

// persists counts one more flush that saw row seq of src fail for reason and returns reason
// once that has lasted GiveUpAfter over at least minConfirmations flushes, "" before.
func (r *Relay) persists(src fence.Key, seq int64, reason string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.stuck[src]
	if !ok || s.seq != seq || s.reason != reason {
		s = stuckRow{seq: seq, reason: reason, since: time.Now()}
	}
	s.seen++
	r.stuck[src] = s
	if s.seen >= minConfirmations && time.Since(s.since) >= r.giveUpAfter {
		return reason
	}
	return ""
}

func (r *Relay) clearStuck(src fence.Key) {
	r.mu.Lock()
	delete(r.stuck, src)
	r.mu.Unlock()
}

func (r *Relay) setFailing(src fence.Key, seq int64) {
	r.mu.Lock()
	r.failing[src] = seq
	r.mu.Unlock()
}

// failedBefore reports whether the last flush of src stopped at row seq; once src moved past
// that row it forgets it.
func (r *Relay) failedBefore(src fence.Key, seq int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	f, ok := r.failing[src]
	if ok && f != seq {
		delete(r.failing, src)
	}
	return ok && f == seq
}

// topicMissing asks the cluster whether topic exists, without creating it. Only an explicit
// UNKNOWN_TOPIC_OR_PARTITION answer for the topic counts as missing.
func (r *Relay) topicMissing(ctx context.Context, topic string) (bool, error) {
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	req.AllowAutoTopicCreation = false
	resp, err := req.RequestWith(ctx, r.client)
	if err != nil {
		return false, err
	}
	for _, t := range resp.Topics {
		if t.Topic != nil && *t.Topic == topic {
			return t.ErrorCode == kerr.UnknownTopicOrPartition.Code, nil
		}
	}
	return false, nil
}

// AfterCommit returns the hook that makes a Baton consumer relay each partition's outbox rows
// from the partition's own goroutine, under its fence key and token, after every committed
// batch and every idle interval:
//
//	consumer.New(group, topics, sink, handler, consumer.AfterCommit(relay.AfterCommit(), time.Second))
//
// So the relay of source partition k runs exactly where k's ownership lives, and stops the
// moment k is revoked or lost. It is Flush without the count, so it holds up the partition for
// at most [FlushTimeout]; a Flush that delivered rows and then ran out of time (a large backlog
// catching up) is not an error, the rest follows on the next call. Its type is the one of
// consumer.AfterCommit's function, spelled out so that outbox does not depend on the consumer.
func (r *Relay) AfterCommit() func(ctx context.Context, k fence.Key, t fence.Token) error {
	return func(ctx context.Context, k fence.Key, t fence.Token) error {
		n, err := r.Flush(ctx, k, t)
		if n > 0 && errors.Is(err, ErrFlushTimeout) && !errors.Is(err, fence.ErrStale) {
			return nil // progress, then out of time: a backlog catching up (a refusal is never hidden)
		}
		return err
	}
}

// publish produces rows and waits for every acknowledgement; it returns each row's error (nil
// for an acknowledged row). All rows are buffered before any is awaited; if one fails franz-go
// fails the rest of its partition, so what reached the broker is a prefix per destination
// partition and the retry re-publishes from the first unacknowledged row.
//
// It uses ProduceSync rather than Produce and a wait of its own: ProduceSync produces the
// records one by one in order, exactly like Produce (so the prefix argument above is
// unchanged), and then ends the linger of the destination partitions it produced to. The relay
// waits for every ack of a batch before marking it, so lingering (franz-go's default is 10 ms,
// and the relay usually shares the consumer's client, whose settings it does not own) only
// added to every batch's commit->ack latency: at 10k msg/s over 4 source partitions the p50
// went from 11.7 ms to 1-4 ms (outbox/pgoutbox BenchmarkRelayPaced).
// The cost: the spans end and the commit_to_ack latency is recorded when the whole batch is
// acknowledged rather than at each record's own ack, which is also when its rows can be marked.
func (r *Relay) publish(ctx context.Context, rows []Row) []error {
	recs := make([]*kgo.Record, len(rows))
	spans := make([]trace.Span, len(rows))
	for i := range rows {
		row := &rows[i]
		parent := ctx
		if row.TraceParent != "" {
			parent = r.tel.prop.Extract(ctx, propagation.MapCarrier{headerTraceParent: row.TraceParent, headerTraceState: row.TraceState})
		}
		pctx, span := r.tel.tracer.Start(parent, "outbox publish "+row.Topic,
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(
				attribute.String("messaging.system", "kafka"),
				attribute.String("messaging.destination.name", row.Topic),
				attribute.String("baton.outbox.source", row.Source.String()),
				attribute.Int64("baton.outbox.seq", row.Seq),
			))
		recs[i], spans[i] = r.record(pctx, row), span
		// Produce keeps a record's own Context: produce hooks (kotel) see the publish span,
		// as when each record was produced with its own ctx.
		recs[i].Context = pctx
	}
	var failed map[*kgo.Record]error // usually empty: no allocation
	for _, res := range r.client.ProduceSync(ctx, recs...) {
		if res.Err != nil {
			if failed == nil {
				failed = make(map[*kgo.Record]error)
			}
			failed[res.Record] = res.Err
		}
	}
	errs := make([]error, len(rows))
	for i, span := range spans {
		if err := failed[recs[i]]; err != nil {
			errs[i] = err
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		} else if created := rows[i].CreatedAt; !created.IsZero() {
			r.tel.latency.Record(ctx, time.Since(created).Seconds())
		}
		span.End()
	}
	return errs
}

// record builds the Kafka record for row: the message's own headers, then the baton headers,
// then the trace context of the publish span (a child of the appending transaction's span).
func (r *Relay) record(ctx context.Context, row *Row) *kgo.Record {
	hs := make([]kgo.RecordHeader, 0, len(row.Headers)+6)
	hs = append(hs, row.Headers...)
	tok, _ := row.Token.MarshalText() // validated when stored
	hs = append(hs,
		kgo.RecordHeader{Key: headerToken, Value: tok},
		kgo.RecordHeader{Key: headerSeq, Value: strconv.AppendInt(nil, row.Seq, 10)},
		kgo.RecordHeader{Key: headerIdempotencyKey, Value: []byte(row.IdempotencyKey)},
		kgo.RecordHeader{Key: headerSource, Value: []byte(row.Source.String())},
	)
	rec := &kgo.Record{Topic: row.Topic, Key: row.Key, Value: row.Value}
	if r.sign != nil {
		rec.Headers = hs
		hs = append(hs, kgo.RecordHeader{Key: headerSignature, Value: []byte(signature(r.sign, rec))})
	}
	c := propagation.MapCarrier{}
	r.tel.prop.Inject(ctx, c)
	if tp := c[headerTraceParent]; tp != "" {
		hs = append(hs, kgo.RecordHeader{Key: headerTraceParent, Value: []byte(tp)})
		if ts := c[headerTraceState]; ts != "" {
			hs = append(hs, kgo.RecordHeader{Key: headerTraceState, Value: []byte(ts)})
		}
	}
	rec.Headers = hs
	return rec
}

// header returns the value of the last header named key.
func header(rec *kgo.Record, key string) ([]byte, bool) {
	for i := len(rec.Headers) - 1; i >= 0; i-- {
		if rec.Headers[i].Key == key {
			return rec.Headers[i].Value, true
		}
	}
	return nil, false
}

// newConfig applies opts (a relay's or an inbox's) with apply.
func newConfig[O any](opts []O, apply func(O, *config) error) (config, error) {
	c := config{batch: defaultBatchSize, timeout: defaultFlushTimeout, giveUpAfter: defaultGiveUpAfter}
	var errs []error
	for i, o := range opts {
		if isNilOption(o) {
			errs = append(errs, fmt.Errorf("%w: option %d is nil", ErrInvalid, i))
			continue
		}
		if err := apply(o, &c); err != nil {
			errs = append(errs, err)
		}
	}
	return c, errors.Join(errs...)
}

// isNilOption reports whether o is a nil Option or RelayOption (a nil func in either).
func isNilOption(o any) bool {
	switch o := o.(type) {
	case nil:
		return true
	case Option:
		return o == nil
	case relayOnly:
		return o == nil
	}
	return false
}
