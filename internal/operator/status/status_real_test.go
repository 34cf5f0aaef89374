package status_test

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/operator/status"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// TestRealGroup runs a real member against the real broker and PostgreSQL and checks what
// status, who-owns, recover and eras say about it, from "no fence rows yet" to a recorded
// recovery and a takeover by a second member.
func TestRealGroup(t *testing.T) {
	const parts = 12
	e := newRealEnv(t, parts)
	c := e.collector(t)
	ctx := testenv.Context(t, 2*time.Minute)

	// Nobody consumed yet: the store has no fence rows for the group, and the group does not exist.
	if _, err := c.Collect(ctx); !errors.Is(err, status.ErrNotFound) || !strings.Contains(err.Error(), "no fence rows") {
		t.Fatalf("Collect before any member: err = %v, want ErrNotFound naming the missing fence rows", err)
	}

	keys := e.produce(t, 120)
	stopA := e.member(t, "member-a", nil)
	snap := waitSnap(t, c, 60*time.Second, "every partition owned by member-a and caught up", allOwnedBy("member-a", parts, true))
	if snap.Summary.Owned != parts || snap.Summary.Members != 1 || snap.Summary.TotalLag != 0 {
		t.Errorf("summary = %+v, want %d owned by 1 member, no lag", snap.Summary, parts)
	}
	for _, p := range snap.Partitions {
		if p.HighWatermark == nil || p.Position == nil || *p.Position != *p.HighWatermark-1 {
			t.Errorf("%s/%d: position %s, high watermark %s: want position = high watermark - 1", p.Topic, p.Partition, fmtp(p.Position), fmtp(p.HighWatermark))
		}
	}
	t.Logf("status of %d partitions read in %s", parts, snap.Took)
	var text bytes.Buffer
	if err := status.WriteText(&text, snap); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "member-a@") || !strings.Contains(text.String(), "12 partitions owned") {
		t.Errorf("text output misses the owner or the summary:\n%s", text.String())
	}

	// who-owns: the partition the producer's default partitioner chose.
	o, err := c.WhoOwns(ctx, e.topic, "k007", "murmur2")
	if err != nil {
		t.Fatalf("WhoOwns: %v", err)
	}
	if o.Line.Partition != keys["k007"] || o.Line.Owner == nil || o.Line.Owner.ClientID != "member-a" {
		t.Errorf("WhoOwns(k007) = partition %d owner %v; the producer wrote it to %d, owned by member-a", o.Line.Partition, o.Line.Owner, keys["k007"])
	}
	if _, err := c.WhoOwns(ctx, "no-such-topic-"+e.group, "k", "murmur2"); !errors.Is(err, status.ErrNotFound) {
		t.Errorf("WhoOwns on a missing topic: err = %v, want ErrNotFound", err)
	}
	if _, err := c.WhoOwns(ctx, e.topic, "k", "fnv99"); !errors.Is(err, status.ErrUsage) {
		t.Errorf("WhoOwns with an unknown partitioner: err = %v, want ErrUsage", err)
	}

	// recover: refused while member-a owns the partition, and without a reason; nothing changes.
	p := keys["k007"]
	k := fence.Key{Group: e.group, Topic: e.topic, Partition: p}
	before, err := e.sink.Load(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Recover(ctx, status.RecoverRequest{Topic: e.topic, Partitions: []int32{p}, Reason: "test"}); !errors.Is(err, status.ErrLiveOwner) {
		t.Errorf("Recover under a live owner: err = %v, want ErrLiveOwner", err)
	}
	if _, err := c.Recover(ctx, status.RecoverRequest{Topic: e.topic, Partitions: []int32{p}, Force: true}); !errors.Is(err, status.ErrUsage) {
		t.Errorf("Recover without a reason: err = %v, want ErrUsage", err)
	}
	if after, _ := e.sink.Load(ctx, k); after != before {
		t.Fatalf("refused recoveries changed the fence: %v -> %v", before, after)
	}

	// member-a leaves: the fences stay as they were left, the group is empty.
	stopA()
	snap = waitSnap(t, c, 30*time.Second, "an empty group", func(s *status.Snapshot) bool { return s.Summary.Members == 0 })
	if l := snap.Partition(e.topic, p); l == nil || l.Owner != nil || l.Token != before.Token.String() {
		t.Errorf("empty group: partition %d line %+v, want no owner and token %s", p, l, before.Token)
	}
	done, err := c.Recover(ctx, status.RecoverRequest{Topic: e.topic, Partitions: []int32{p}, Reason: "group recreated by test", Claimant: "operator:test@host"})
	if err != nil || len(done) != 1 || done[0].To != "1.0" {
		t.Fatalf("Recover = %+v, %v; want one recovery to 1.0", done, err)
	}
	snap, _ = c.Collect(ctx)
	if len(snap.Recoveries) != 1 || !strings.Contains(snap.Recoveries[0].Reason, "operator:test@host") || snap.Summary.Regressions != 0 {
		t.Errorf("recoveries = %+v (summary %+v), want the operator's, naming the claimant", snap.Recoveries, snap.Summary)
	}
	if l := snap.Partition(e.topic, p); l == nil || l.LastRecovery == nil || l.Token != "1.0" {
		t.Errorf("partition %d after recover: %+v, want token 1.0 and the last recovery", p, l)
	}

	// member-b takes over every partition, the recovered one in the new era.
	e.member(t, "member-b", nil)
	snap = waitSnap(t, c, 60*time.Second, "every partition owned by member-b", allOwnedBy("member-b", parts, false))
	if l := snap.Partition(e.topic, p); !strings.HasPrefix(l.Token, "1.") {
		t.Errorf("partition %d after the takeover: token %s, want era 1", p, l.Token)
	}
}

func fmtp(p *int64) string {
	if p == nil {
		return "nil"
	}
	return strconv.FormatInt(*p, 10)
}

// TestBadInput: unreachable sources and a wrong store each give one sentence naming what was
// tried, and nothing is created.
func TestBadInput(t *testing.T) {
	ctx := context.Background()
	c, err := status.NewCollector(status.Config{Brokers: []string{"127.0.0.1:1"}, Store: "postgres://u:secret@127.0.0.1:1/db", Group: "g", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	snap, err := c.Collect(ctx)
	if !errors.Is(err, status.ErrUnreachable) {
		t.Fatalf("err = %v, want ErrUnreachable", err)
	}
	for _, want := range []string{"Kafka at 127.0.0.1:1", "PostgreSQL at postgres://u:xxxxx@127.0.0.1:1/db"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "secret") {
		t.Errorf("error shows the password: %v", err)
	}
	if snap == nil || len(snap.Sources) != 2 || snap.Sources[0].Err == "" || snap.Sources[1].Err == "" {
		t.Errorf("snapshot sources = %+v, want both failed", snap)
	}

	missing := t.TempDir() + "/missing.db"
	if _, err := status.OpenStore(ctx, missing, status.Tables{}, status.ReadOnly); !errors.Is(err, status.ErrUnreachable) || !strings.Contains(err.Error(), missing) {
		t.Errorf("OpenStore(missing file) = %v, want ErrUnreachable naming the file", err)
	}
	if _, err := status.NewCollector(status.Config{Store: "mysql://x", Group: ""}); !errors.Is(err, status.ErrUsage) ||
		!strings.Contains(err.Error(), "no brokers") || !strings.Contains(err.Error(), "no consumer group") || !strings.Contains(err.Error(), "mysql://x") {
		t.Errorf("NewCollector(bad config) = %v, want every problem named", err)
	}
}
