package audit_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/operator/audit"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// join makes a static member (group.instance.id instance) of e's group that consumes the
// source topic, and waits until the coordinator describes the group stable with the partition
// assigned to it. It returns the member id.
func (e *env) join(t *testing.T, instance string) string {
	t.Helper()
	assigned := make(chan struct{}, 1)
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.ConsumerGroup(e.group), kgo.ConsumeTopics(e.src),
		kgo.InstanceID(instance), kgo.DisableAutoCommit(), kgo.FetchMaxWait(100*time.Millisecond),
		kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) {
			select {
			case assigned <- struct{}{}:
			default:
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			cl.PollFetches(ctx)
		}
	}()
	t.Cleanup(func() { cancel(); <-done; cl.Close() })
	select {
	case <-assigned:
	case <-time.After(30 * time.Second):
		t.Fatal("the member was not assigned the partition within 30s")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		gs, err := e.adm.DescribeGroups(context.Background(), e.group)
		if err == nil {
			if g := gs[e.group]; g.State == "Stable" && len(g.Members) == 1 {
				if a, ok := g.Members[0].Assigned.AsConsumer(); ok && len(a.Topics) == 1 {
					return g.Members[0].MemberID
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the group was not described stable with its member's assignment within 30s: %v %v", gs, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A fence claimed by a member that left the group, while the partition moved to a member that
// has not claimed it: within the handover bound nothing, past it a violation naming both; once
// the owner claims, nothing again.
func TestOwnershipClaimantNotTheOwner(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		e.produce(t, 3)
		instance := testenv.UniqueName("owner")
		member := e.join(t, instance)
		gone := "static:" + testenv.UniqueName("gone") + "/0123456789abcdef"
		e.claimAs(t, tok5, gone)
		e.apply(t, tok5, 0, 1)
		a, clk := e.auditor(t)
		if r := clean(t, a, "claimed by a member gone, within the bound"); r.Owned != 1 {
			t.Fatalf("the pass compared %d fences with their owner, want 1", r.Owned)
		}
		clk.t = clk.t.Add(30 * time.Second)
		clean(t, a, "claimed by a member gone, within the bound")
		e.apply(t, tok5, 2, 2) // the member gone still writes
		clk.t = clk.t.Add(31 * time.Second)
		ev := within(t, e, a, audit.Ownership, "not the partition's owner")
		is(t, ev, "claimant", gone)
		is(t, ev, "claimant_in_group", false)
		is(t, ev, "owner_member_id", member)
		is(t, ev, "position_then", 1)
		is(t, ev, "position", 2)
		// The owner claims: its claimant names its instance.
		e.claimAs(t, fence.Token{Epoch: 6}, "static:"+instance+"/00000000000000ff/"+member)
		clk.t = clk.t.Add(time.Hour)
		if r := clean(t, a, "claimed by the owner"); r.Owned != 1 {
			t.Fatalf("the pass compared %d fences with their owner, want 1", r.Owned)
		}
	})
}

// A member that commits offsets on a partition no fence claims (a writer without the fence):
// the committed offset moving between two passes is the violation; once the fence is claimed,
// commits are the fence's business.
func TestOwnershipCommitWithoutFence(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		e.produce(t, 10)
		commit(t, e, 3)
		a, _ := e.auditor(t)
		clean(t, a, "a committed offset, first seen")
		clean(t, a, "a committed offset, unchanged")
		commit(t, e, 5)
		ev := within(t, e, a, audit.Ownership, "no fence claims")
		is(t, ev, "committed_before", 3)
		is(t, ev, "committed", 5)
		e.claim(t, tok5)
		e.apply(t, tok5, 0, 6)
		commit(t, e, 7)
		clean(t, a, "claimed, then committed")
	})
}

// Passes that cannot read the fence rows (here: the table locked past the auditor's timeout)
// while a member commits after its claim and apply: the partition's fence is missing from what
// was read, not from the sink, so a commit that moved between two such passes is no violation.
func TestOwnershipCommitMovedWhileFencesUnread(t *testing.T) {
	e := pgEnv(t)
	e.produce(t, 10)
	e.claim(t, tok5)
	e.apply(t, tok5, 0, 2)
	commit(t, e, 3)
	a, _ := e.auditor(t, func(c *audit.Config) { c.Timeout = time.Second })
	clean(t, a, "claimed, applied and committed, first seen")
	clean(t, a, "unchanged")
	e.apply(t, tok5, 3, 5)

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, e.store)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE `+e.fenceTbl+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	for _, at := range []int64{5, 6} {
		commit(t, e, at)
		r, err := a.Pass(ctx)
		if err == nil {
			t.Fatal("the pass read the fences through the lock: the test cannot show an unread pass")
		}
		for _, v := range r.Violations {
			if v.Check == audit.Ownership {
				t.Errorf("a pass that could not read the fences judged a commit (to %d) with no fence row read: %v", at, v)
			}
		}
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	clean(t, a, "the fences read again")
}
