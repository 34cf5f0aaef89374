package consumer

import (
	"context"
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// EpochSource says which epoch a newly assigned partition's token carries, and proves with the
// group coordinator that this member is still current at that epoch. The classic-protocol
// source ([ClassicGeneration]) uses the group generation; a KIP-848 source would use the
// per-partition assignment epochs of KIP-1251.
type EpochSource interface {
	// AssignedEpoch is called from OnPartitionsAssigned and returns the epoch of the
	// assignment being delivered, for every partition in it.
	AssignedEpoch(cl *kgo.Client) (int64, error)
	// VerifyCurrent asks the coordinator whether this member still holds epoch: true only
	// if the coordinator confirms it, false if it refuses; an error if it cannot tell.
	VerifyCurrent(ctx context.Context, cl *kgo.Client, epoch int64) (bool, error)
}

// ClassicGeneration is the epoch source of the classic group protocol: the group generation
// read with GroupMetadata when the partitions are assigned; currentness is proven with a
// heartbeat carrying our member id and that generation, which the coordinator accepts only
// at the group's current generation.
func ClassicGeneration() EpochSource { return classicGeneration{} }

type classicGeneration struct{}

var _ EpochSource = classicGeneration{}

var errNoGeneration = errors.New("consumer: no group generation")

func (classicGeneration) AssignedEpoch(cl *kgo.Client) (int64, error) {
	_, gen := cl.GroupMetadata()
	if gen < 0 {
		return 0, errNoGeneration
	}
	return int64(gen), nil
}

func (classicGeneration) VerifyCurrent(ctx context.Context, cl *kgo.Client, epoch int64) (bool, error) {
	member, _ := cl.GroupMetadata()
	req := kmsg.NewPtrHeartbeatRequest()
	req.Group = groupOf(cl)
	req.MemberID = member
	req.Generation = int32(epoch)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return false, err
	}
	switch err := kerr.ErrorForCode(resp.ErrorCode); {
	case err == nil, errors.Is(err, kerr.RebalanceInProgress):
		// The coordinator checks member and generation before the group state, so
		// REBALANCE_IN_PROGRESS also proves the generation is the group's current one.
		return true, nil
	case errors.Is(err, kerr.IllegalGeneration), errors.Is(err, kerr.UnknownMemberID), errors.Is(err, kerr.FencedInstanceID):
		return false, nil
	default:
		return false, err
	}
}

func groupOf(cl *kgo.Client) string {
	v := cl.OptValue(kgo.ConsumerGroup)
	s, _ := v.(string)
	return s
}
