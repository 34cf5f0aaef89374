package audit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/operator/status"
	"github.com/batonhq/baton/outbox"
)

// outputReader reads the output topics incrementally, from their start: each pass goes on where
// the last one stopped, up to the end offsets listed after the store was read, and at most
// Config.MaxBytes.
type outputReader struct {
	cl      *kgo.Client
	adm     *kadm.Client
	topics  []string
	max     int64
	timeout time.Duration
	next    map[string]map[int32]int64 // the next offset to read, per partition
}

func newOutputReader(cfg Config) (*outputReader, error) {
	opts := append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...), kgo.DialTimeout(cfg.Timeout), kgo.RequestRetries(1),
		kgo.ConsumeTopics(cfg.OutputTopics...), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(200 * time.Millisecond)}, cfg.KgoOpts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: kafka client: %v", status.ErrUsage, err)
	}
	return &outputReader{cl: cl, adm: kadm.NewClient(cl), topics: slices.Clone(cfg.OutputTopics), max: cfg.MaxBytes,
		timeout: cfg.Timeout, next: map[string]map[int32]int64{}}, nil
}

func (o *outputReader) close() { o.cl.Close() }

// read hands every record read to fn, counting bytes and requests in r, and sets r.CaughtUp
// when every partition was read to the end offsets listed at its start.
func (o *outputReader) read(ctx context.Context, r *Report, fn func(copyRecord)) error {
	lctx, cancel := context.WithTimeout(ctx, o.timeout)
	ends, err := o.adm.ListEndOffsets(lctx, o.topics...)
	var starts kadm.ListedOffsets
	if err == nil {
		starts, err = o.adm.ListStartOffsets(lctx, o.topics...)
	}
	cancel()
	r.Requests += 2
	if err == nil {
		err = errors.Join(ends.Error(), starts.Error())
	}
	if err != nil {
		return fmt.Errorf("%w: listing the offsets of the output topics %s: %v", status.ErrUnreachable, strings.Join(o.topics, ","), err)
	}
	behind := func() bool {
		b := false
		ends.Each(func(e kadm.ListedOffset) {
			from := o.next[e.Topic][e.Partition]
			if s, ok := starts.Lookup(e.Topic, e.Partition); ok && s.Offset > from {
				from = s.Offset
			}
			if from < e.Offset {
				b = true
			}
		})
		return b
	}
	for behind() {
		if r.BytesRead >= o.max {
			return nil // bounded: the next pass goes on
		}
		pctx, cancel := context.WithTimeout(ctx, o.timeout)
		fs := o.cl.PollRecords(pctx, 1000)
		cancel()
		r.Requests++
		if err := ctx.Err(); err != nil {
			return err
		}
		n := 0
		fs.EachRecord(func(rec *kgo.Record) {
			n++
			size := int64(len(rec.Key) + len(rec.Value))
			for _, h := range rec.Headers {
				size += int64(len(h.Key) + len(h.Value))
			}
			r.BytesRead += size
			if o.next[rec.Topic] == nil {
				o.next[rec.Topic] = map[int32]int64{}
			}
			o.next[rec.Topic][rec.Partition] = rec.Offset + 1
			fn(copyRecord{rec})
		})
		if n == 0 {
			if err := fs.Err0(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("%w: reading the output topics %s: %v", status.ErrUnreachable, strings.Join(o.topics, ","), err)
			}
			return nil // nothing within the timeout: not caught up, the next pass goes on
		}
	}
	r.CaughtUp = true
	return nil
}

// copyRecord is a record read from an output topic.
type copyRecord struct{ rec *kgo.Record }

// sourceState is what the output topics showed of one source partition's outbox.
type sourceState struct {
	cursor  status.OutboxCursor // the cursor read in the current pass
	base    int64               // sequences at or below it were delivered before the audit began (-1: not set)
	contig  int64               // every sequence at or below it was read (or lies below base, or was judged)
	above   map[int64]bool      // first copies read above contig
	maxSeq  int64               // the highest first copy read, and its token and place
	maxTok  fence.Token
	maxAt   string
	readMax int64  // the highest sequence read before this pass's cursor
	readAt  string // where: topic/partition@offset
	dead    []int64
}

// source returns k's state, setting its baseline at its cursor's first observation: the rows
// it had delivered then may have copies the output topics no longer hold.
func (a *Auditor) source(k fence.Key, c status.OutboxCursor) *sourceState {
	s := a.srcs[k]
	if s == nil {
		s = &sourceState{base: -1, contig: -1, above: map[int64]bool{}}
		a.srcs[k] = s
	}
	if s.base < 0 {
		s.base = c.Delivered
		s.contig = max(s.contig, c.Delivered)
		s.advance()
	}
	return s
}

// advance moves contig over the first copies read right above it.
func (s *sourceState) advance() {
	for q := range s.above {
		if q <= s.contig {
			delete(s.above, q)
		}
	}
	for s.above[s.contig+1] {
		delete(s.above, s.contig+1)
		s.contig++
	}
}

// copySeen takes one record of an output topic: a copy of an outbox row of the audited group is
// a first copy (its sequence not read before) or a re-published one (counted).
func (a *Auditor) copySeen(c copyRecord, r *Report, add func(Violation)) {
	env, err := outbox.ParseEnvelope(c.rec)
	if err != nil || env.Source.Group != a.cfg.Group {
		return
	}
	if len(a.cfg.Topics) > 0 && !slices.Contains(a.cfg.Topics, env.Source.Topic) {
		return
	}
	s := a.srcs[env.Source]
	if s == nil {
		s = &sourceState{base: -1, contig: -1, above: map[int64]bool{}}
		a.srcs[env.Source] = s
	}
	at := fmt.Sprintf("%s/%d@%d", c.rec.Topic, c.rec.Partition, c.rec.Offset)
	if env.Seq > s.readMax {
		s.readMax, s.readAt = env.Seq, at
	}
	switch {
	case s.base >= 0 && env.Seq <= s.base:
		return // delivered before the audit began
	case env.Seq <= s.contig || s.above[env.Seq]:
		r.Republished++
		return
	}
	s.above[env.Seq] = true
	if v, bad := judgeFirstCopy(env.Source, s, env.Seq, env.Token, at, a.now()); bad {
		add(v)
	}
	if env.Seq > s.maxSeq {
		s.maxSeq, s.maxTok, s.maxAt = env.Seq, env.Token, at
	}
	if s.base >= 0 {
		s.advance()
	}
}

// judgeFirstCopy is the Delivery check's order judgement: a first copy above the highest read
// so far carries a token no lower than that one's.
func judgeFirstCopy(k fence.Key, s *sourceState, seq int64, tok fence.Token, at string, now time.Time) (Violation, bool) {
	if seq < s.maxSeq || tok.Compare(s.maxTok) >= 0 {
		return Violation{}, false
	}
	return violation(Delivery, k, now, fmt.Sprint(seq), "first copy's token below an earlier sequence's",
		f("seq", seq), f("token", tok.String()), f("copy", at), f("previous_seq", s.maxSeq), f("previous_token", s.maxTok.String()), f("previous_copy", s.maxAt)), true
}

// judgeBeyond is the Delivery check's sequence judgement: every copy read before the current
// cursor was read carries a sequence the outbox allocated.
func judgeBeyond(k fence.Key, s *sourceState, now time.Time) []Violation {
	if s.cursor.Topic == "" || s.readMax <= s.cursor.LastSeq {
		return nil
	}
	return []Violation{violation(Delivery, k, now, fmt.Sprint(s.readMax), "copy of a sequence the outbox never allocated",
		f("seq", s.readMax), f("copy", s.readAt), f("last_seq", s.cursor.LastSeq), f("delivered_seq", s.cursor.Delivered))}
}

// judgeHoles is the Outbox check's delivery judgement, once the output topics were read to the
// end offsets listed after the cursors: every sequence the cursor counts as delivered since the
// audit began has a copy, or was dead-lettered.
func (a *Auditor) judgeHoles(add func(Violation)) {
	now := a.now()
	for k, s := range a.srcs {
		if s.base < 0 || s.cursor.Topic == "" {
			continue
		}
		if v, bad := judgeDelivered(k, s, now); bad {
			add(v)
		}
		s.contig = max(s.contig, s.cursor.Delivered)
		s.advance()
	}
}

func judgeDelivered(k fence.Key, s *sourceState, now time.Time) (Violation, bool) {
	var first, n int64
	for q := s.contig + 1; q <= s.cursor.Delivered; q++ {
		if s.above[q] || slices.Contains(s.dead, q) {
			continue
		}
		if n == 0 {
			first = q
		}
		n++
	}
	if n == 0 {
		return Violation{}, false
	}
	return violation(Outbox, k, now, fmt.Sprint(first), "cursor passed a row with no copy on the output topics",
		f("first_missing_seq", first), f("missing", n), f("delivered_seq", s.cursor.Delivered), f("last_seq", s.cursor.LastSeq)), true
}
