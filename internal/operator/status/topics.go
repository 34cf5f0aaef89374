package status

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/fence/sqlitefence"
)

// TopicIdentity compares the identity stored with a topic's fences (fence.Topics) with the
// topic as the brokers describe it now.
type TopicIdentity struct {
	Topic  string              `json:"topic"`
	Stored *fence.Topic        `json:"stored"` // nil: no identity stored yet (no claim since the upgrade)
	Broker *fence.Topic        `json:"broker"` // nil: the topic does not exist on the brokers
	State  string              `json:"state"`  // "ok", "recreated", "grown", "missing", "not seen"
	Log    []fence.TopicRecord `json:"history"`
}

func (t TopicIdentity) verdict() string {
	switch {
	case t.Broker == nil:
		return "missing"
	case t.Stored == nil:
		return "not seen"
	case t.Stored.ID != "" && t.Broker.ID != "" && t.Stored.ID != t.Broker.ID:
		return "recreated"
	case t.Broker.Partitions > t.Stored.Partitions:
		return "grown"
	}
	return "ok"
}

func (s *Store) topics() (fence.Topics, error) {
	if s.pg != nil {
		return pgfence.New(s.pg, pgfence.Table(s.tables.Fence))
	}
	return sqlitefence.New(s.sql, sqlitefence.Table(s.tables.Fence))
}

// brokerTopics describes topics as the brokers see them now, with a metadata request of its
// own: the client's cached metadata (kadm's) may be seconds old. A topic the brokers do not
// know is absent; one without an ID (a broker without topic IDs) has ID "".
func (c *Collector) brokerTopics(ctx context.Context, names []string) (map[string]fence.Topic, error) {
	out := map[string]fence.Topic{}
	if len(names) == 0 {
		return out, nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	resp, err := metadataRequest(names).RequestWith(ctx, c.kcl)
	if err != nil {
		return nil, errorf(ErrUnreachable, "Kafka at %s: describing %s: %v", c.brokers(), strings.Join(names, ","), err)
	}
	for _, t := range resp.Topics {
		if t.Topic == nil || t.ErrorCode != 0 {
			continue
		}
		var id string
		if t.TopicID != ([16]byte{}) {
			id = base64.RawURLEncoding.EncodeToString(t.TopicID[:]) // Kafka's text form
		}
		out[*t.Topic] = fence.Topic{ID: id, Partitions: int32(len(t.Partitions))}
	}
	return out, nil
}

// metadataRequest asks for the metadata of the topics names.
func metadataRequest(names []string) *kmsg.MetadataRequest {
	req := kmsg.NewPtrMetadataRequest()
	for _, n := range names {
		t := kmsg.NewMetadataRequestTopic()
		t.Topic = kmsg.StringPtr(n)
		req.Topics = append(req.Topics, t)
	}
	return req
}

// Topics compares, for every topic the group has fences for (or the configured topics), the
// identity stored with the fences with the brokers' view: a recreated topic or a grown one
// is held by the consumer until [Collector.ResetTopic].
func (c *Collector) Topics(ctx context.Context) ([]TopicIdentity, error) {
	if c.Sharded() {
		return nil, errUnsharded()
	}
	sctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	st, err := OpenStore(sctx, c.cfg.Store, c.cfg.Tables, ReadOnly)
	cancel()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	names := slices.Clone(c.cfg.Topics)
	if len(names) == 0 {
		fences, err := st.Fences(ctx, c.cfg.Group)
		if err != nil {
			return nil, err
		}
		for _, f := range fences {
			if !slices.Contains(names, f.Topic) {
				names = append(names, f.Topic)
			}
		}
	}
	slices.Sort(names)
	if len(names) == 0 {
		return nil, nil
	}
	ts, err := st.topics()
	if err != nil {
		return nil, err
	}
	broker, err := c.brokerTopics(ctx, names)
	if err != nil {
		return nil, err
	}
	var out []TopicIdentity
	for _, n := range names {
		h, err := ts.TopicHistory(ctx, c.cfg.Group, n)
		if err != nil {
			return nil, fmt.Errorf("reading the identity of %s from %s: %w", n, st.Describe(), err)
		}
		ti := TopicIdentity{Topic: n, Log: h}
		if len(h) > 0 {
			ti.Stored = &h[len(h)-1].Identity
		}
		if b, ok := broker[n]; ok {
			ti.Broker = &b
		}
		ti.State = ti.verdict()
		out = append(out, ti)
	}
	return out, nil
}

// TopicResetRequest is an operator's reset of a topic's stored identity to the brokers' view.
type TopicResetRequest struct {
	Topic string
	// Growth: acknowledge growth (same ID, more partitions) after draining the older
	// partitions; otherwise accept a recreated topic (another ID), which moves every fence of
	// the topic to a new era with no position: the new incarnation is read from its
	// beginning.
	Growth   bool
	Reason   string // required; recorded
	Claimant string // who asks, recorded: see [Claimant]
}

// ResetTopic sets the identity stored with the topic's fences to the brokers' view, by a
// recorded compare-and-set (fence.Topics.ResetTopic). It refuses a request that does not
// match what happened (a reset of a topic that was not recreated, an acknowledgement of one
// that did not grow) and changes nothing then. It returns the identities before and after.
func (c *Collector) ResetTopic(ctx context.Context, req TopicResetRequest) (from, to fence.Topic, err error) {
	if c.Sharded() {
		return from, to, errUnsharded()
	}
	var errs []error
	if strings.TrimSpace(req.Reason) == "" {
		errs = append(errs, errorf(ErrUsage, "needs a reason (-reason): it is recorded with the reset"))
	}
	if req.Topic == "" {
		errs = append(errs, errorf(ErrUsage, "needs a topic (-topic)"))
	}
	if req.Claimant == "" {
		req.Claimant = Claimant()
	}
	if err := errors.Join(errs...); err != nil {
		return from, to, err
	}
	sctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	st, err := OpenStore(sctx, c.cfg.Store, c.cfg.Tables, ReadWrite)
	cancel()
	if err != nil {
		return from, to, err
	}
	defer st.Close()
	ts, err := st.topics()
	if err != nil {
		return from, to, err
	}
	h, err := ts.TopicHistory(ctx, c.cfg.Group, req.Topic)
	if err != nil {
		return from, to, err
	}
	if len(h) == 0 {
		return from, to, errorf(ErrNotFound, "%s stores no identity for %s/%s: no consumer claimed it since the upgrade; nothing to reset", st.Describe(), c.cfg.Group, req.Topic)
	}
	from = h[len(h)-1].Identity
	broker, err := c.brokerTopics(ctx, []string{req.Topic})
	if err != nil {
		return from, to, err
	}
	b, ok := broker[req.Topic]
	if !ok {
		return from, to, errorf(ErrNotFound, "topic %q does not exist on the brokers at %s", req.Topic, c.brokers())
	}
	ti := TopicIdentity{Stored: &from, Broker: &b}
	switch v := ti.verdict(); {
	case req.Growth && v != "grown":
		return from, to, errorf(ErrUsage, "%s/%s is %s (stored %s, brokers %s): nothing to acknowledge", c.cfg.Group, req.Topic, v, from, b)
	case !req.Growth && v != "recreated":
		return from, to, errorf(ErrUsage, "%s/%s is %s (stored %s, brokers %s): not recreated, nothing to reset", c.cfg.Group, req.Topic, v, from, b)
	}
	to = b
	if req.Growth {
		to.ID = from.ID // an acknowledgement never changes the ID
	}
	if err := ts.ResetTopic(ctx, c.cfg.Group, req.Topic, from, to, req.Reason+" (by "+req.Claimant+")"); err != nil {
		return from, to, fmt.Errorf("resetting %s/%s in %s: %w", c.cfg.Group, req.Topic, st.Describe(), err)
	}
	return from, to, nil
}
