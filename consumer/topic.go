package consumer

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/fencecheck"
)

// A topic's identity. The fences are keyed by topic name, but
// their positions are offsets of one incarnation of the topic, and a key's partition depends
// on the partition count. After every claim the worker compares the topic it reads (its
// Kafka topic ID, KIP-516, and partition count, from a Metadata request) with the identity
// the sink stores with the fences ([fence.Topics]); a sink without it is not checked (a WARN
// at the first claim). A recreated topic, or a partition added by growing it, is held: the
// claim is kept, nothing is applied, and the worker looks again every RetryBackoff limit until
// an operator resets the identity (baton topics reset / ack).

// topicIDText is Kafka's text form of a topic ID: URL-safe base64 without padding.
func topicIDText(id [16]byte) string {
	if id == ([16]byte{}) {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString(id[:])
}

// topicView returns what the brokers say of topic: its ID and partition count.
func topicView(ctx context.Context, cl *kgo.Client, topic string) (fence.Topic, [16]byte, error) {
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fence.Topic{}, [16]byte{}, err
	}
	for _, t := range resp.Topics {
		if t.Topic != nil && *t.Topic == topic {
			if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
				return fence.Topic{}, [16]byte{}, fmt.Errorf("%w: metadata of %s: %w", errCannotTell, topic, err)
			}
			return fence.Topic{ID: topicIDText(t.TopicID), Partitions: int32(len(t.Partitions))}, t.TopicID, nil
		}
	}
	return fence.Topic{}, [16]byte{}, fmt.Errorf("%w: metadata answered without %s", errCannotTell, topic)
}

// topicStep runs opTopic: it compares the topic as the brokers describe it now with the
// identity stored with the fences (adopting it if none is), and returns the decision's input;
// Event 0 means the worker must stop (cancelled, or an error retrying cannot change).
func (w *worker[Tx]) topicStep() claimInput {
	ts, ok := w.r.c.sink.(fence.Topics)
	if !ok {
		w.r.c.noTopics.Do(func() {
			w.r.c.log.Warn("the sink does not implement fence.Topics: a recreated or grown topic is not detected", w.log()...)
		})
		return claimInput{Event: evTopicSame}
	}
	var seen, stored fence.Topic
	var raw [16]byte
	var adopted bool
	err := w.attempt("topic", func() (err error) {
		if seen, raw, err = topicView(w.ctx, w.r.client(), w.key.Topic); err != nil {
			return err
		}
		// This partition exists: the count is at least its number + 1, whatever a broker
		// with older metadata says.
		seen.Partitions = max(seen.Partitions, w.key.Partition+1)
		stored, adopted, err = ts.SeeTopic(w.ctx, w.key.Group, w.key.Topic, seen,
			fmt.Sprintf("adopted by the first claim that saw it (%s)", w.claimant))
		return err
	})
	if err != nil {
		w.stuck("topic", err)
		return claimInput{}
	}
	if adopted {
		w.r.c.log.Info("topic identity stored with the fences", append(w.log(), "topic_id", stored.ID, "partitions", stored.Partitions)...)
	}
	w.topicID.Store(&raw)
	w.seenParts.Store(seen.Partitions)
	_, err = fencecheck.CheckTopic(w.key, stored, true, seen)
	var te *fence.TopicError
	switch {
	case err == nil:
		w.held = nil
		return claimInput{Event: evTopicSame}
	case errors.As(err, &te):
		w.held = te
		if errors.Is(err, fence.ErrTopicRecreated) {
			return claimInput{Event: evTopicRecreated}
		}
		return claimInput{Event: evTopicGrown}
	}
	w.stuck("topic", err)
	return claimInput{}
}

// hold runs opHold: the partition's topic was recreated or grown. It reports it (ERROR and
// the metric at the first refusal of an episode), waits, and returns false if the worker was
// cancelled meanwhile.
func (w *worker[Tx]) hold(why giveUp) bool {
	if !w.holding {
		w.holding = true
		outcome := map[giveUp]string{holdRecreated: "recreated", holdGrown: "grown"}[why]
		w.r.c.m.topicRefusals.Add(w.ctx, 1, w.r.c.m.outcome(w.id, outcome))
		msg := "topic recreated: its ID differs from the one stored with the fences; partition held (nothing applied) until an operator resets it with baton topics reset"
		if why == holdGrown {
			msg = "topic grown: this partition is at or above the acknowledged partition count; partition held (nothing applied) until an operator drains the older partitions and acknowledges the growth with baton topics ack"
		}
		w.r.c.log.Error(msg, append(w.log(), "err", w.held, "stored", w.held.Stored.String(), "seen", w.held.Seen.String())...)
	}
	return w.sleep(w.r.c.cfg.retryMax)
}

// batchTopicMoved reports whether records fetched from a topic ID other than the one this
// claim compared (a topic recreated while the worker runs) are about to be applied.
func (w *worker[Tx]) batchTopicMoved() bool {
	fetched, checked := w.fetchedID.Load(), w.topicID.Load()
	return fetched != nil && checked != nil && *fetched != ([16]byte{}) && *checked != ([16]byte{}) && *fetched != *checked
}

// lost reports records deleted from the log (retention, truncation) before they were applied:
// the batch starts after the next offset expected (the sink's position + 1; with no position,
// the offset the claim sought to), and the log now starts there too. Processing
// continues with what the log still has (a stalled partition would not bring the records
// back); the loss is logged at ERROR and counted (baton.consumer.records.lost), and baton
// status shows the gap. Gaps the log itself has (transaction markers, compaction) are below
// the log start offset's reach and are not reported.
func (w *worker[Tx]) lost(first int64) {
	next := w.position + 1
	if w.position == fence.NoPosition {
		if w.sought < 0 {
			return // fetching resumed at Kafka's committed or start offset: nothing was expected
		}
		next = w.sought // the claim sought there (0 in a moved era, or a restarted worker's first record)
	}
	start := w.logStart.Load()
	if first <= next || start <= next {
		return
	}
	n := min(first, start) - next
	w.r.c.m.lost.Add(w.ctx, n, w.r.c.m.part(w.id))
	w.r.c.log.Error("records deleted from the log before they were applied (retention or truncation): data loss",
		append(w.log(), "from", next, "to", next+n-1, "lost", n, "log_start", start)...)
}

// unknownTopicLook bounds how often the poller looks at a topic whose fetches fail with
// UNKNOWN_TOPIC_ID.
const unknownTopicLook = 5 * time.Second

// unknownTopicID handles fetches refused with UNKNOWN_TOPIC_ID: the broker does not host the
// topic ID the client fetches, because the topic was deleted (and perhaps recreated) or the
// broker has not learned it yet. franz-go never moves a topic name to a new ID: a recreation
// stops the topic's fetches until it is purged from the client and added back. At most every
// few seconds per topic, the poller asks the brokers for the topic's ID; if it differs from
// the one this member's claims compared, the topic was recreated: it is purged from the
// client and added back, so its partitions are assigned afresh, and each new claim compares
// the new incarnation with the identity stored with the fences, which holds them (ERROR,
// baton.consumer.topic_refusals) until an operator resets it. The ID compared is the one the
// refused fetch used (fetched), when the response names it: a member whose claims compared
// the new incarnation (assigned after the recreation) still fetches with the old ID its client
// keeps, and comparing the claims' ID would take that for a lagging broker forever (found by
// the chaos fault topic-recreate: partitions never read after the reset). Runs on the poll
// goroutine.
func (r *run[Tx]) unknownTopicID(ctx context.Context, topic string, fetched [16]byte) {
	if r.looked == nil {
		r.looked = map[string]time.Time{}
	}
	if time.Since(r.looked[topic]) < unknownTopicLook {
		return
	}
	r.looked[topic] = time.Now()
	var known *[16]byte
	r.mu.Lock()
	for id, w := range r.workers {
		if id.Topic == topic {
			if k := w.topicID.Load(); k != nil && *k != ([16]byte{}) {
				known = k
			}
		}
	}
	r.mu.Unlock()
	if fetched != ([16]byte{}) {
		known = &fetched
	}
	lctx, cancel := context.WithTimeout(ctx, unknownTopicLook)
	defer cancel()
	_, now, err := topicView(lctx, r.client(), topic)
	switch {
	case err != nil:
		r.c.log.Warn("fetches refused with UNKNOWN_TOPIC_ID and the topic cannot be described: deleted?", "topic", topic, "err", err)
	case known == nil || now == ([16]byte{}) || now == *known:
		r.c.log.Warn("fetches refused with UNKNOWN_TOPIC_ID; the brokers describe the topic with the ID this member knows: a broker lags", "topic", topic, "topic_id", topicIDText(now))
	default:
		r.c.log.Error("topic recreated: the brokers describe it with a new ID; following the new incarnation, whose partitions are held until an operator resets the topic (baton topics reset)",
			"topic", topic, "was", topicIDText(*known), "now", topicIDText(now))
		cl := r.client()
		cl.PurgeTopicsFromClient(topic)
		cl.AddConsumeTopics(topic)
	}
}

// topicLook is how often a member compares each consumed topic's partition count and ID with
// what its workers' claims compared.
const topicLook = 5 * time.Second

// watchTopics asks the brokers, every topicLook, for each consumed topic's identity, and
// makes every worker of a topic that grew (or got another ID) since its claim compare it again
// before its next batch: growing a topic moves keys between all its partitions, and a member
// whose assignment did not change is not told. Partitions of a grown topic are then held
// until the growth is acknowledged. Until a member looks (topicLook) its older partitions
// go on; the drain-then-grow procedure keeps them empty meanwhile. A look that sees a topic
// grow also refreshes the client's metadata, so that the group leader assigns the new
// partitions now rather than at its next refresh (MetadataMaxAge, 5 minutes by default).
func (r *run[Tx]) watchTopics() {
	defer r.wg.Done()
	t := time.NewTicker(topicLook)
	defer t.Stop()
	looked := map[string]int32{} // each topic's partition count at the previous look
	refresh := map[string]int{}  // looks left that refresh the client's metadata
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		}
		if _, ok := r.c.sink.(fence.Topics); !ok {
			continue
		}
		for _, topic := range r.c.topics {
			ctx, cancel := context.WithTimeout(r.ctx, topicLook)
			view, raw, err := topicView(ctx, r.client(), topic)
			cancel()
			if err != nil {
				r.c.log.Debug("topic look failed", "topic", topic, "err", err)
				continue // the next look; fetches and claims report lasting trouble
			}
			prev, seen := looked[topic]
			r.mu.Lock()
			for id, w := range r.workers {
				if id.Topic != topic {
					continue
				}
				if !seen {
					prev = max(prev, w.seenParts.Load())
				}
				if k := w.topicID.Load(); k != nil && (view.Partitions > w.seenParts.Load() || *k != raw) && !w.recheck.Swap(true) {
					r.c.log.Debug("topic changed since the claim: compare again before the next batch", append(w.log(), "partitions", view.Partitions, "compared", w.seenParts.Load())...)
				}
			}
			r.mu.Unlock()
			looked[topic] = max(prev, view.Partitions)
			if view.Partitions > prev && prev > 0 {
				// The topic grew: the group assigns the new partitions when the leader's
				// client sees them in its metadata, which it refreshes on its own only every
				// MetadataMaxAge (5 minutes by default). Refresh now and at the next look (a
				// broker may not know the new partitions yet): once acknowledged, the new
				// partitions (a standalone relay's new shards) are processed within seconds.
				refresh[topic] = 2
			}
			if refresh[topic] > 0 {
				refresh[topic]--
				r.client().ForceMetadataRefresh()
			}
		}
	}
}
