package consumer_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/partition"
)

// The proofs of ownership, one request shaped at a time with kfake's ControlKey: each answer
// that must not be taken as proof is given alone, the other requests answered as a real
// coordinator would, so a proof that skips a check or misreads an answer is seen at once.

// joinClassic joins group on kfake (a classic member, no auto-commit) and returns the client
// once it is assigned, with its member id and generation.
func joinClassic(t *testing.T, brokers []string, group, topic string) (*kgo.Client, string, int32) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.DisableAutoCommit(), kgo.FetchMaxWait(100*time.Millisecond), kgo.RetryBackoffFn(func(int) time.Duration { return 10 * time.Millisecond }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		cl.PollFetches(ctx)
		cancel()
		if m, g := cl.GroupMetadata(); g > 0 && m != "" {
			return cl, m, g
		}
		if time.Now().After(deadline) {
			t.Fatal("the member was never assigned")
		}
	}
}

// commitAnswer answers every OffsetCommit of group's member with code for each partition.
func commitAnswer(c *kfake.Cluster, member string, code int16) {
	c.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		r := req.(*kmsg.OffsetCommitRequest)
		if r.MemberID != member {
			return nil, nil, false
		}
		resp := r.ResponseKind().(*kmsg.OffsetCommitResponse)
		for _, rt := range r.Topics {
			st := kmsg.NewOffsetCommitResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewOffsetCommitResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
}

// A loading coordinator answers the OffsetCommit with COORDINATOR_LOAD_IN_PROGRESS: the commit
// proves nothing, so the proof cannot tell, even though the DescribeGroups that follows (which
// a loaded coordinator answers) lists the member, Stable, with the partition.
func TestClassicProofLoadingCommitCannotTell(t *testing.T) {
	c, brokers := fakeCluster(t, kfake.SeedTopics(1, "orders"))
	cl, member, gen := joinClassic(t, brokers, "g", "orders")
	p0 := partition.ID{Topic: "orders", Partition: 0}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The unshaped proof holds: the member owns p0 at its generation.
	if owned, ok, err := consumer.ClassicGeneration().VerifyCurrent(ctx, cl, p0, int64(gen)); err != nil || !ok || owned != int64(gen) {
		t.Fatalf("the owner's proof at generation %d: (%d, %v, %v), want (%d, true, nil)", gen, owned, ok, err, gen)
	}
	commitAnswer(c, member, kerr.CoordinatorLoadInProgress.Code)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	owned, ok, err := consumer.ClassicGeneration().VerifyCurrent(ctx2, cl, p0, int64(gen))
	if ok {
		t.Fatalf("an OffsetCommit answered COORDINATOR_LOAD_IN_PROGRESS was taken as proof (owned %d): want \"cannot tell\"", owned)
	}
	if err == nil {
		t.Fatalf("an OffsetCommit answered COORDINATOR_LOAD_IN_PROGRESS read as a refusal: want \"cannot tell\" (an error)")
	}
	t.Logf("cannot tell: %v", err)
}

// describeAnswer answers DescribeGroups for group: Stable, member listed with the partitions
// of topic that the returned function last set (none at first), after the members of others
// with theirs.
func describeAnswer(c *kfake.Cluster, group, member, topic string, others ...otherMember) (assign func(ps ...int32)) {
	var cur atomic.Pointer[[]int32]
	cur.Store(&[]int32{})
	c.ControlKey(int16(kmsg.DescribeGroups), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		ps := *cur.Load()
		r := req.(*kmsg.DescribeGroupsRequest)
		resp := r.ResponseKind().(*kmsg.DescribeGroupsResponse)
		g := kmsg.NewDescribeGroupsResponseGroup()
		g.Group, g.State, g.ProtocolType, g.Protocol = group, "Stable", "consumer", "cooperative-sticky"
		for _, o := range append(others, otherMember{member, ps}) {
			a := kmsg.NewConsumerMemberAssignment()
			at := kmsg.NewConsumerMemberAssignmentTopic()
			at.Topic, at.Partitions = topic, o.partitions
			a.Topics = append(a.Topics, at)
			m := kmsg.NewDescribeGroupsResponseGroupMember()
			m.MemberID, m.MemberAssignment = o.id, a.AppendTo(nil)
			g.Members = append(g.Members, m)
		}
		resp.Groups = append(resp.Groups, g)
		return resp, nil, true
	})
	return func(ps ...int32) { cur.Store(&ps) }
}

// otherMember is a member a shaped DescribeGroups answer lists, and its partitions.
type otherMember struct {
	id         string
	partitions []int32
}

// The description proves ownership by this member's own assignment: another member listed
// before it with the partition vouches for nothing.
func TestClassicProofReadsItsOwnAssignment(t *testing.T) {
	c, brokers := fakeCluster(t, kfake.SeedTopics(2, "orders"))
	cl, member, gen := joinClassic(t, brokers, "g", "orders")
	p0 := partition.ID{Topic: "orders", Partition: 0}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	assign := describeAnswer(c, "g", member, "orders", otherMember{"member-b", []int32{0}})
	assign(1)
	if owned, ok, err := consumer.ClassicGeneration().VerifyCurrent(ctx, cl, p0, int64(gen)); ok || err != nil {
		t.Fatalf("member %s, assigned p1, proven owner of p0 (%d, %v, %v) by member-b's assignment listed before its own: want a refusal", member, owned, ok, err)
	}
	assign(0, 1)
	if owned, ok, err := consumer.ClassicGeneration().VerifyCurrent(ctx, cl, p0, int64(gen)); !ok || err != nil || owned != int64(gen) {
		t.Fatalf("member %s, assigned p0: (%d, %v, %v), want (%d, true, nil)", member, owned, ok, err, gen)
	}
}

// A member that stays in the group across a rebalance but loses the partition: its commit at
// the assignment's generation is refused, its commit at the current one accepted (the member
// is in the current generation), and only the description tells that the partition is no
// longer its own. The proof must refuse; taking the second commit alone as proof of a
// partition kept would re-claim, and recover the era away from its new owner.
func TestClassicProofRetainedNeedsTheDescription(t *testing.T) {
	c, brokers := fakeCluster(t, kfake.SeedTopics(2, "orders"))
	cl, member, gen := joinClassic(t, brokers, "g", "orders")
	p0 := partition.ID{Topic: "orders", Partition: 0}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// p0 was assigned at the generation before this one; the group's description at the
	// current generation gives the member p1 only.
	assign := describeAnswer(c, "g", member, "orders")
	assign(1)
	owned, ok, err := consumer.ClassicGeneration().VerifyCurrent(ctx, cl, p0, int64(gen)-1)
	if ok {
		t.Fatalf("a partition the member lost at generation %d was proven kept (owned %d) by the OffsetCommit alone: the description assigning it only p1 was not asked", gen, owned)
	}
	if err != nil {
		t.Fatalf("proof of a partition lost in a Stable group: %v, want a refusal", err)
	}
	// The same description with p0 in it proves p0 kept at the current generation.
	assign(0, 1)
	if owned, ok, err := consumer.ClassicGeneration().VerifyCurrent(ctx, cl, p0, int64(gen)-1); err != nil || !ok || owned != int64(gen) {
		t.Fatalf("a partition kept into generation %d: (%d, %v, %v), want (%d, true, nil)", gen, owned, ok, err, gen)
	}
}

// A KIP-848 coordinator lists the member at an epoch below the one the partition was assigned
// at: the group was deleted and recreated and the member id joined the new one, so its
// membership is not the one that made the assignment. Even with the partition in its
// assignment and the OffsetCommit accepted, the proof must refuse.
func TestAssignmentEpochsProofRefusesAMemberBelowTheAssignmentEpoch(t *testing.T) {
	c, brokers := fakeCluster(t, kfake.SeedTopics(1, "orders"))
	const group, member = "g848", "member-848"
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumerGroup(group))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var memberEpoch atomic.Int32
	c.ControlKey(int16(kmsg.ConsumerGroupDescribe), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		r := req.(*kmsg.ConsumerGroupDescribeRequest)
		resp := r.ResponseKind().(*kmsg.ConsumerGroupDescribeResponse)
		g := kmsg.NewConsumerGroupDescribeResponseGroup()
		g.Group, g.State, g.Epoch, g.AssignmentEpoch = group, "Stable", memberEpoch.Load(), memberEpoch.Load()
		m := kmsg.NewConsumerGroupDescribeResponseGroupMember()
		m.MemberID, m.MemberEpoch, m.MemberType = member, memberEpoch.Load(), 1
		tp := kmsg.NewAssignmentTopicPartition()
		tp.Topic, tp.Partitions = "orders", []int32{0}
		m.Assignment.TopicPartitions = append(m.Assignment.TopicPartitions, tp)
		g.Members = append(g.Members, m)
		resp.Groups = append(resp.Groups, g)
		return resp, nil, true
	})
	commitAnswer(c, member, 0) // the commit is accepted: only the epoch check refuses
	c.ControlKey(int16(kmsg.OffsetFetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		r := req.(*kmsg.OffsetFetchRequest)
		resp := r.ResponseKind().(*kmsg.OffsetFetchResponse)
		for _, rg := range r.Groups { // no offset committed yet, in either layout
			g := kmsg.NewOffsetFetchResponseGroup()
			g.Group = rg.Group
			for _, rt := range rg.Topics {
				gt := kmsg.NewOffsetFetchResponseGroupTopic()
				gt.Topic, gt.TopicID = rt.Topic, rt.TopicID
				for _, p := range rt.Partitions {
					gp := kmsg.NewOffsetFetchResponseGroupTopicPartition()
					gp.Partition, gp.Offset, gp.LeaderEpoch = p, -1, -1
					gt.Partitions = append(gt.Partitions, gp)
				}
				g.Topics = append(g.Topics, gt)
			}
			resp.Groups = append(resp.Groups, g)
		}
		for _, rt := range r.Topics {
			ft := kmsg.NewOffsetFetchResponseTopic()
			ft.Topic = rt.Topic
			for _, p := range rt.Partitions {
				fp := kmsg.NewOffsetFetchResponseTopicPartition()
				fp.Partition, fp.Offset, fp.LeaderEpoch = p, -1, -1
				ft.Partitions = append(ft.Partitions, fp)
			}
			resp.Topics = append(resp.Topics, ft)
		}
		return resp, nil, true
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p0 := partition.ID{Topic: "orders", Partition: 0}
	memberEpoch.Store(5)
	if owned, ok, err := consumer.ProveOwned848(ctx, cl, member, p0, 5); err != nil || !ok || owned != 5 {
		t.Fatalf("a member at its assignment's epoch 5: proof (%d, %v, %v), want (5, true, nil)", owned, ok, err)
	}
	memberEpoch.Store(3)
	owned, ok, err := consumer.ProveOwned848(ctx, cl, member, p0, 5)
	if ok {
		t.Fatalf("a member listed at epoch 3 was proven owner of a partition assigned at epoch 5 (owned %d): the member epoch was not compared with the assignment's", owned)
	}
	if err != nil {
		t.Fatalf("a member below the assignment epoch: %v, want a refusal", err)
	}
}
