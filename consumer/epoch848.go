package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/batonhq/baton/partition"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Group protocols, as Kafka's consumer config group.protocol names them.
const (
	protocolClassic  = "classic"  // JoinGroup/SyncGroup, client-side assignment: classicGeneration
	protocolConsumer = "consumer" // KIP-848, server-side assignment: assignmentEpochs
)

// assignmentEpochs is the epoch source of KIP-848 ("consumer" protocol) groups: each
// partition's epoch is the member epoch at which the coordinator assigned it to this member.
// The coordinator adds a partition to a member's assignment at the target assignment epoch and
// moves the member to that epoch in the same step, so the member epoch franz-go reports when
// the partition is delivered is the partition's assignment epoch (KIP-1251 records it per
// partition on Kafka 4.3+), or a later epoch at which the member still holds it. It is
// strictly higher than every earlier owner's: a partition moves only after its owner released
// it, and the new owner's epoch is a target assignment epoch computed after that release.
//
// Choosing it selects the KIP-848 protocol (franz-go's kgo.ServerSideBalancer, with its range
// or sticky balancer: the default cooperative-sticky is one). It needs Kafka 4.0+ with the
// consumer protocol enabled, and Kafka 4.3+ (KIP-1251) to prove ownership at an epoch older
// than the member's current one. If franz-go falls back to the classic protocol (an older
// broker, or a balancer KIP-848 does not offer), the first assignment fails [Consumer.Run].
//
// Ownership of a partition at epoch e is proven with two requests the coordinator answers only
// from the group's loaded state: a ConsumerGroupDescribe that lists this member, at a member
// epoch E >= e, with the partition in its assignment (which includes partitions pending
// revocation: the member still owns those); then an OffsetCommit that names the partition,
// this member's id and epoch e, rewriting the offset Kafka holds (as classicGeneration
// does). The coordinator refuses the commit with UNKNOWN_MEMBER_ID when the member left or
// was fenced, and with STALE_MEMBER_EPOCH when e is above the member's epoch or, e being
// older, when the partition is not the member's or was assigned to it after e (KIP-1251's
// per-partition check). At e equal to the member's current epoch the commit checks no
// partition; the description, taken at that same epoch, does: a member loses a partition only
// by acknowledging its revocation, which moves it to a later epoch.
type assignmentEpochs struct{}

var _ epochSource = assignmentEpochs{}

// ErrNotConsumerGroup is returned by [Consumer.Run] when KIP-848 was asked for (GroupProtocol("consumer"))
// and franz-go joined with the classic protocol.
var ErrNotConsumerGroup = errors.New("consumer: the group is not a KIP-848 (consumer protocol) group: franz-go fell back to the classic protocol (a broker before Kafka 4.0, group.coordinator.rebalance.protocols without \"consumer\", or a first kgo.Balancers entry other than a range or sticky balancer)")

// fallbackCheck bounds the request AssignedEpoch makes to see that the group is a KIP-848 one.
const fallbackCheck = 5 * time.Second

func (assignmentEpochs) AssignedEpoch(cl *kgo.Client) (int64, error) {
	member, epoch := cl.GroupMetadata()
	if epoch <= 0 {
		// 0 is a KIP-848 member's joining epoch; it names no assignment.
		return 0, fmt.Errorf("%w (member epoch %d)", errNoGeneration, epoch)
	}
	ctx, cancel := context.WithTimeout(context.Background(), fallbackCheck)
	defer cancel()
	if _, err := describe848(ctx, cl, member); errors.Is(err, ErrNotConsumerGroup) {
		return 0, err
	}
	// Any other answer (even none) is left to the proof, which retries what cannot tell.
	return int64(epoch), nil
}

func (assignmentEpochs) VerifyCurrent(ctx context.Context, cl *kgo.Client, p partition.ID, epoch int64) (int64, bool, error) {
	member, gen := cl.GroupMetadata()
	owned, ok, err := proveOwned(ctx, cl, member, p, epoch)
	if err != nil || !ok {
		return 0, false, caughtUp(cl, member, gen, err)
	}
	return owned, true, nil
}

// proveOwned asks the coordinator whether member owns p at epoch (see assignmentEpochs): ok
// with owned == epoch if so; ok with the member's later epoch if p is the member's but was
// assigned to it after epoch; not ok if the coordinator refuses; an error if it cannot tell.
func proveOwned(ctx context.Context, cl *kgo.Client, member string, p partition.ID, epoch int64) (int64, bool, error) {
	d, err := describe848(ctx, cl, member)
	if errors.Is(err, ErrNotConsumerGroup) {
		// No KIP-848 group of this name (deleted, or of the other protocol): it has no member
		// to own anything. (At the first assignment the same answer fails Run instead.)
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	var id [16]byte
	if d.listed && !d.owns(p, id) {
		if id, err = topicID(ctx, cl, p.Topic); err != nil {
			return 0, false, err
		}
	}
	if !d.listed || !d.owns(p, id) || int64(d.epoch) < epoch {
		// Not the member's partition; or the coordinator's member is at an epoch below the
		// one p was assigned at, so not the membership that assigned it (a recreated group).
		return 0, false, nil
	}
	ok, err := commitProof848(ctx, cl, p, member, epoch)
	if err != nil || ok {
		return epoch, ok, err
	}
	if int64(d.epoch) == epoch {
		// Refused at the epoch the description just showed: the member moved on in between.
		// Its next answer tells.
		return 0, false, fmt.Errorf("%w: epoch %d refused while the member moved on", errCannotTell, epoch)
	}
	// p is the member's, assigned after epoch: prove it at the member's epoch of the
	// description, which every assignment epoch of its partitions is at most.
	if ok, err = commitProof848(ctx, cl, p, member, int64(d.epoch)); err != nil || !ok {
		return 0, false, err
	}
	return int64(d.epoch), true, nil
}

// commitProof848 is commitProof with the consumer protocol's refusals: STALE_MEMBER_EPOCH (the
// epoch is above the member's, or older than the partition's assignment epoch, or the
// partition is not the member's) and FENCED_MEMBER_EPOCH are "not current", like
// UNKNOWN_MEMBER_ID.
func commitProof848(ctx context.Context, cl *kgo.Client, p partition.ID, member string, epoch int64) (bool, error) {
	ok, err := commitProof(ctx, cl, p, member, epoch)
	if errors.Is(err, kerr.StaleMemberEpoch) || errors.Is(err, kerr.FencedMemberEpoch) {
		return false, nil
	}
	return ok, err
}

// described is this member as a ConsumerGroupDescribe answer lists it.
type described struct {
	listed bool
	epoch  int32
	owned  map[string][]int32 // topic -> partitions, assigned or pending revocation
	ids    map[[16]byte][]int32
}

// owns says whether p (whose topic has the ID id, zero if unknown) is in the assignment,
// named by topic or, where the answer left the name out, by topic ID.
func (d described) owns(p partition.ID, id [16]byte) bool {
	return slices.Contains(d.owned[p.Topic], p.Partition) || id != [16]byte{} && slices.Contains(d.ids[id], p.Partition)
}

// describe848 asks the coordinator for member's epoch and assignment in the group. An error
// means it cannot tell (loading, not the coordinator, a network error), except
// ErrNotConsumerGroup: the group exists and is not a KIP-848 group.
func describe848(ctx context.Context, cl *kgo.Client, member string) (described, error) {
	group := groupOf(cl)
	req := kmsg.NewPtrConsumerGroupDescribeRequest()
	req.Groups = []string{group}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return described{}, err
	}
	for _, g := range resp.Groups {
		if g.Group != group {
			continue
		}
		if err := kerr.ErrorForCode(g.ErrorCode); err != nil {
			if errors.Is(err, kerr.GroupIDNotFound) || errors.Is(err, kerr.UnsupportedVersion) {
				// Kafka answers GROUP_ID_NOT_FOUND for a group of another type ("is not a
				// consumer group"); a KIP-848 group this member is in is never missing. A 4.x
				// broker with the consumer protocol off (group.coordinator.rebalance.protocols
				// without "consumer", or group.version < 1) answers UNSUPPORTED_VERSION for
				// every group (KafkaApis.handleConsumerGroupDescribe): there is no KIP-848
				// group, and it is the very answer on which franz-go falls back to classic.
				return described{}, fmt.Errorf("%w: describe: %w", ErrNotConsumerGroup, err)
			}
			return described{}, fmt.Errorf("%w: consumer group describe: %w", errCannotTell, err)
		}
		var d described
		for _, m := range g.Members {
			if m.MemberID != member {
				continue
			}
			if m.MemberType == 0 {
				return described{}, fmt.Errorf("%w: member %s uses the classic protocol", ErrNotConsumerGroup, member)
			}
			d.listed, d.epoch = true, m.MemberEpoch
			d.owned, d.ids = map[string][]int32{}, map[[16]byte][]int32{}
			for _, t := range m.Assignment.TopicPartitions {
				d.owned[t.Topic] = append(d.owned[t.Topic], t.Partitions...)
				d.ids[t.TopicID] = append(d.ids[t.TopicID], t.Partitions...)
			}
		}
		return d, nil
	}
	return described{}, fmt.Errorf("%w: consumer group describe answered without %s", errCannotTell, group)
}

// groupProtocol is implemented by the epoch sources that select a group protocol.
type groupProtocol interface{ protocol() string }

func (assignmentEpochs) protocol() string  { return protocolConsumer }
func (classicGeneration) protocol() string { return protocolClassic }

// resolveProtocol checks the group protocol against the epoch source, at New: a protocol
// chosen with [GroupProtocol] picks its epoch source when no test set one, and is
// refused with a source of the other protocol (a source of the caller's own, which names no
// protocol, is taken at its word). The KIP-848 protocol adds franz-go's opt-in,
// kgo.ServerSideBalancer.
func (c *config) resolveProtocol() error {
	src := ""
	if g, ok := c.epochs.(groupProtocol); ok {
		src = g.protocol()
	}
	switch {
	case c.protocol == "":
		c.protocol = cmp.Or(src, protocolClassic)
	case src == "" || src == c.protocol:
	case !c.epochsSet:
		c.epochs = assignmentEpochs{}
		if c.protocol == protocolClassic {
			c.epochs = classicGeneration{}
		}
	default:
		return fmt.Errorf("%w: GroupProtocol(%q) with an epoch source of the %q protocol: the token of a %s group comes from that protocol's epochs", ErrInvalidOption, c.protocol, src, c.protocol)
	}
	if c.protocol == protocolConsumer {
		c.kafka = append(c.kafka, kgo.ServerSideBalancer())
	}
	return nil
}

// kip848ContextOptIn is franz-go's older opt-in to KIP-848: any value under this plain string
// key in the context given with kgo.WithContext makes it join as a KIP-848 member, exactly as
// kgo.ServerSideBalancer does.
const kip848ContextOptIn = "opt_in_kafka_next_gen_balancer_beta"

// protocolAtRun refuses kgo.ServerSideBalancer, or franz-go's context opt-in to KIP-848, among
// the Kafka options of a classic-protocol consumer: franz-go would join as a KIP-848 member
// while the epoch source proves ownership with the classic protocol's requests, which a
// KIP-848 group refuses for ever (every partition stalls). Like ownedInClient, it reads the
// options from a client without a group.
func protocolAtRun(user []kgo.Opt, protocol string) error {
	if protocol != protocolClassic {
		return nil
	}
	cl, err := kgo.NewClient(slices.Concat([]kgo.Opt{probeSeed}, user,
		[]kgo.Opt{kgo.ConsumerGroup(""), kgo.ConsumeTopics(), kgo.ConsumePartitions(nil)})...)
	if err != nil {
		return fmt.Errorf("%w: kafka: %w", ErrInvalidOption, err)
	}
	defer cl.Close()
	if v, _ := cl.OptValue(kgo.ServerSideBalancer).(bool); v {
		return fmt.Errorf("%w: kgo.ServerSideBalancer among the Kafka options with the classic group protocol: select KIP-848 with GroupProtocol(%q)", ErrInvalidOption, protocolConsumer)
	}
	if ctx, _ := cl.OptValue(kgo.WithContext).(context.Context); ctx != nil && ctx.Value(kip848ContextOptIn) != nil {
		return fmt.Errorf("%w: the context of kgo.WithContext holds %q (franz-go's KIP-848 opt-in) with the classic group protocol: select KIP-848 with GroupProtocol(%q)", ErrInvalidOption, kip848ContextOptIn, protocolConsumer)
	}
	return nil
}
