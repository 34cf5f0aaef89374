package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/batonhq/baton/partition"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// epochSource says which epoch a newly assigned partition's token carries, and proves with the
// group coordinator that this member owns a partition. The classic-protocol source
// (classicGeneration) uses the group generation; a KIP-848 source would use the
// per-partition assignment epochs of KIP-1251.
type epochSource interface {
	// AssignedEpoch is called from OnPartitionsAssigned and returns the epoch of the
	// assignment being delivered, for every partition in it.
	AssignedEpoch(cl *kgo.Client) (int64, error)
	// VerifyCurrent asks the coordinator whether this member owns p at epoch. It returns
	// ok with owned == epoch if the coordinator confirms it; ok with a later owned epoch if
	// the member owns p at that later epoch (a partition kept across a rebalance); not ok if
	// the coordinator refuses (another member owns p, or this member left the group); and an
	// error if it cannot tell, which the caller retries and never takes as proof. The proof
	// must not be one the coordinator can answer without checking (a loading coordinator
	// answers a Heartbeat blindly).
	VerifyCurrent(ctx context.Context, cl *kgo.Client, p partition.ID, epoch int64) (owned int64, ok bool, err error)
}

// classicGeneration is the epoch source of the classic group protocol: the group generation
// read with GroupMetadata when the partitions are assigned. Ownership of a partition at a
// generation is proven with two requests that the coordinator answers only from the group's
// loaded state: an OffsetCommit carrying this member's id, the generation (and
// group.instance.id, if static) that names the partition, which the coordinator accepts only
// from a member of the current generation and refuses with COORDINATOR_LOAD_IN_PROGRESS while
// it loads the group; then a DescribeGroups whose answer lists this member with the partition
// in its assignment, in a stable group. The commit rewrites the offset Kafka already holds for
// the partition (OffsetFetch first; -1 when none, which Kafka stores and reports as "no
// offset", so no consumer's start position moves). Only both together prove ownership: the
// commit proves the generation is current, the description that the partition is ours in it.
type classicGeneration struct{}

var _ epochSource = classicGeneration{}

var (
	errNoGeneration = errors.New("consumer: no group generation")
	errCannotTell   = errors.New("consumer: the coordinator cannot tell yet")
)

func (classicGeneration) AssignedEpoch(cl *kgo.Client) (int64, error) {
	_, gen := cl.GroupMetadata()
	if gen < 0 {
		return 0, errNoGeneration
	}
	return int64(gen), nil
}

func (classicGeneration) VerifyCurrent(ctx context.Context, cl *kgo.Client, p partition.ID, epoch int64) (int64, bool, error) {
	member, gen := cl.GroupMetadata()
	owned := epoch
	ok, err := commitProof(ctx, cl, p, member, epoch)
	if err != nil {
		return 0, false, err
	}
	if !ok {
		if int64(gen) <= epoch {
			// The coordinator refused the assignment's generation, and this client has not
			// heard of a later one yet: the group moved on while its join is in flight. Whether
			// it kept p is not known until franz-go either revokes p (which ends this worker) or
			// reports the new generation, so this cannot tell; it is never taken as "not
			// current", which would leave a partition the member keeps unprocessed.
			return 0, false, caughtUp(cl, member, gen, fmt.Errorf("%w: generation %d refused before this client saw a later one", errCannotTell, epoch))
		}
		// Not current at the assignment's generation; the member may have kept p into its
		// current one.
		if ok, err = commitProof(ctx, cl, p, member, int64(gen)); err != nil || !ok {
			return 0, false, caughtUp(cl, member, gen, err)
		}
		owned = int64(gen)
	}
	ok, err = describeProof(ctx, cl, p, member)
	if err != nil || !ok {
		return 0, false, caughtUp(cl, member, gen, err)
	}
	return owned, true, nil
}

// caughtUp turns a refusal into "cannot tell" when this client's membership (member id,
// generation) changed while it was being proven, or when the refusal was itself undecided
// (cause): the proof then spoke about a membership that is no longer this client's. nil
// means the refusal stands.
func caughtUp(cl *kgo.Client, member string, gen int32, cause error) error {
	if cause != nil {
		return cause
	}
	if m, g := cl.GroupMetadata(); m != member || g != gen {
		return fmt.Errorf("%w: this member's generation moved from %d to %d while it was being proven", errCannotTell, gen, g)
	}
	return nil
}

// commitProof commits, as member at gen, the offset Kafka already has for p: true if the
// coordinator accepts it (gen is the group's current generation and member is in it), false
// if it refuses, an error if it cannot tell.
func commitProof(ctx context.Context, cl *kgo.Client, p partition.ID, member string, gen int64) (bool, error) {
	group := groupOf(cl)
	id, err := topicID(ctx, cl, p.Topic)
	if err != nil {
		return false, err
	}
	// Both layouts: the request names the topic and its ID (OffsetCommit and OffsetFetch
	// switched to topic IDs in v10), so whichever version is negotiated names p.
	of := kmsg.NewPtrOffsetFetchRequest()
	of.Group = group
	ft := kmsg.NewOffsetFetchRequestTopic()
	ft.Topic, ft.Partitions = p.Topic, []int32{p.Partition}
	of.Topics = append(of.Topics, ft)
	fg := kmsg.NewOffsetFetchRequestGroup()
	fg.Group = group
	fgt := kmsg.NewOffsetFetchRequestGroupTopic()
	fgt.Topic, fgt.TopicID, fgt.Partitions = p.Topic, id, []int32{p.Partition}
	fg.Topics = append(fg.Topics, fgt)
	of.Groups = append(of.Groups, fg)
	fresp, err := of.RequestWith(ctx, cl)
	if err != nil {
		return false, err
	}
	offset, leaderEpoch, meta, err := fetched(fresp, group, p, id)
	if err != nil {
		return false, err
	}
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group, req.MemberID, req.Generation = group, member, int32(gen)
	if id, ok := cl.OptValue(kgo.InstanceID).(string); ok && id != "" {
		req.InstanceID = &id
	}
	rt := kmsg.NewOffsetCommitRequestTopic()
	rt.Topic, rt.TopicID = p.Topic, id
	rp := kmsg.NewOffsetCommitRequestTopicPartition()
	rp.Partition, rp.Offset, rp.LeaderEpoch, rp.Metadata = p.Partition, offset, leaderEpoch, meta
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return false, err
	}
	code := int16(-1)
	for _, t := range resp.Topics {
		for _, pp := range t.Partitions {
			if (t.Topic == p.Topic || t.TopicID == id && id != [16]byte{}) && pp.Partition == p.Partition {
				code = pp.ErrorCode
			}
		}
	}
	if code == -1 {
		return false, fmt.Errorf("%w: offset commit answered without %s", errCannotTell, p)
	}
	switch err := kerr.ErrorForCode(code); {
	case err == nil:
		return true, nil
	case errors.Is(err, kerr.IllegalGeneration), errors.Is(err, kerr.UnknownMemberID), errors.Is(err, kerr.FencedInstanceID):
		return false, nil
	default:
		// COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR, REBALANCE_IN_PROGRESS (the
		// generation is current but its assignment is not delivered yet), ...
		return false, fmt.Errorf("%w: offset commit: %w", errCannotTell, err)
	}
}

// topicID returns the ID of topic (KIP-516), zero if the cluster has none.
func topicID(ctx context.Context, cl *kgo.Client, topic string) ([16]byte, error) {
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return [16]byte{}, err
	}
	for _, t := range resp.Topics {
		if t.Topic != nil && *t.Topic == topic {
			if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
				return [16]byte{}, fmt.Errorf("%w: metadata of %s: %w", errCannotTell, topic, err)
			}
			return t.TopicID, nil
		}
	}
	return [16]byte{}, fmt.Errorf("%w: metadata answered without %s", errCannotTell, topic)
}

// fetched reads p's committed offset from an OffsetFetch response (either layout).
func fetched(resp *kmsg.OffsetFetchResponse, group string, p partition.ID, id [16]byte) (offset int64, leaderEpoch int32, meta *string, err error) {
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return 0, 0, nil, fmt.Errorf("%w: offset fetch: %w", errCannotTell, err)
	}
	topics := resp.Topics
	for _, g := range resp.Groups {
		if g.Group == group {
			if err := kerr.ErrorForCode(g.ErrorCode); err != nil {
				return 0, 0, nil, fmt.Errorf("%w: offset fetch: %w", errCannotTell, err)
			}
			topics = topics[:0:0]
			for _, t := range g.Topics {
				ft := kmsg.NewOffsetFetchResponseTopic()
				ft.Topic = t.Topic
				if t.TopicID == id && id != [16]byte{} {
					ft.Topic = p.Topic
				}
				for _, pp := range t.Partitions {
					fp := kmsg.NewOffsetFetchResponseTopicPartition()
					fp.Partition, fp.Offset, fp.LeaderEpoch, fp.Metadata, fp.ErrorCode = pp.Partition, pp.Offset, pp.LeaderEpoch, pp.Metadata, pp.ErrorCode
					ft.Partitions = append(ft.Partitions, fp)
				}
				topics = append(topics, ft)
			}
		}
	}
	for _, t := range topics {
		for _, pp := range t.Partitions {
			if t.Topic != p.Topic || pp.Partition != p.Partition {
				continue
			}
			if err := kerr.ErrorForCode(pp.ErrorCode); err != nil {
				return 0, 0, nil, fmt.Errorf("%w: offset fetch: %w", errCannotTell, err)
			}
			if pp.Offset < 0 {
				return -1, -1, pp.Metadata, nil
			}
			return pp.Offset, pp.LeaderEpoch, pp.Metadata, nil
		}
	}
	return 0, 0, nil, fmt.Errorf("%w: offset fetch answered without %s", errCannotTell, p)
}

// describeProof asks the coordinator for the group's members: true if member is in the stable
// group with p in its assignment, false if the stable group does not list member or assigns
// it no p, an error if it cannot tell (loading, rebalancing, not the coordinator).
func describeProof(ctx context.Context, cl *kgo.Client, p partition.ID, member string) (bool, error) {
	group := groupOf(cl)
	req := kmsg.NewPtrDescribeGroupsRequest()
	req.Groups = []string{group}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return false, err
	}
	for _, g := range resp.Groups {
		if g.Group != group {
			continue
		}
		if err := kerr.ErrorForCode(g.ErrorCode); err != nil {
			return false, fmt.Errorf("%w: describe group: %w", errCannotTell, err)
		}
		if g.State != "Stable" {
			return false, fmt.Errorf("%w: group is %s", errCannotTell, g.State)
		}
		for _, m := range g.Members {
			if m.MemberID != member {
				continue
			}
			var a kmsg.ConsumerMemberAssignment
			if err := a.ReadFrom(m.MemberAssignment); err != nil {
				return false, fmt.Errorf("%w: member assignment: %w", errCannotTell, err)
			}
			for _, t := range a.Topics {
				if t.Topic == p.Topic && slices.Contains(t.Partitions, p.Partition) {
					return true, nil
				}
			}
			return false, nil
		}
		return false, nil
	}
	return false, fmt.Errorf("%w: describe group answered without %s", errCannotTell, group)
}

func groupOf(cl *kgo.Client) string {
	v := cl.OptValue(kgo.ConsumerGroup)
	s, _ := v.(string)
	return s
}
