package status_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/internal/operator/status"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// TestTopicsResetAndAck: baton topics against kfake and an SQLite store. A topic whose stored
// ID is not the brokers' is shown recreated; only a reset (not an acknowledgement) accepts it,
// moving the fences to a new era with no position, recorded. Then the topic grows: shown
// grown; only an acknowledgement accepts it, and the fences keep their positions. Records
// deleted before they were applied show as data loss in the snapshot.
func TestTopicsResetAndAck(t *testing.T) {
	ctx := context.Background()
	brokers := testenv.FakeKafka(t, kfake.SeedTopics(2, "t"))
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("t"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := 0; i < 10; i++ {
		if err := cl.ProduceSync(ctx, &kgo.Record{Partition: 1, Value: []byte("v")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	adm := kadm.NewClient(cl)
	path := filepath.Join(t.TempDir(), "f.db")
	st, err := sqlitefence.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	old := fence.Topic{ID: "deleted-incarnation", Partitions: 2}
	if _, _, err := st.SeeTopic(ctx, "g", "t", old, "test: seeded"); err != nil {
		t.Fatal(err)
	}
	k0, k1 := fence.Key{Group: "g", Topic: "t", Partition: 0}, fence.Key{Group: "g", Topic: "t", Partition: 1}
	for _, k := range []fence.Key{k0, k1} {
		if _, err := st.Claim(ctx, k, fence.Token{Epoch: 3}, "test"); err != nil {
			t.Fatal(err)
		}
		if err := st.Apply(ctx, k, fence.Token{Epoch: 3}, 0, 2, func(context.Context, *sql.Tx) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	c, err := status.NewCollector(status.Config{Brokers: brokers, Store: path, Group: "g", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	state := func(want string) {
		t.Helper()
		// The client's metadata may lag a change for up to its minimum age (5s).
		deadline := time.Now().Add(15 * time.Second)
		ts, err := c.Topics(ctx)
		for (err != nil || len(ts) != 1 || ts[0].State != want) && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
			ts, err = c.Topics(ctx)
		}
		if err != nil || len(ts) != 1 || ts[0].State != want {
			t.Fatalf("Topics = %+v, %v; want t %s", ts, err, want)
		}
		var b bytes.Buffer
		if err := status.WriteTopics(&b, ts); err != nil || !strings.Contains(b.String(), want) {
			t.Fatalf("WriteTopics = %q, %v", b.String(), err)
		}
	}
	state("recreated")
	req := status.TopicResetRequest{Topic: "t", Growth: true, Reason: "r", Claimant: "operator:test@host"}
	if _, _, err := c.ResetTopic(ctx, req); !errors.Is(err, status.ErrUsage) {
		t.Fatalf("ack of a recreated topic: %v, want ErrUsage", err)
	}
	req.Growth, req.Reason = false, ""
	if _, _, err := c.ResetTopic(ctx, req); !errors.Is(err, status.ErrUsage) {
		t.Fatalf("reset without a reason: %v, want ErrUsage", err)
	}
	req.Reason = "topic recreated by the platform team"
	from, to, err := c.ResetTopic(ctx, req)
	if err != nil || from != old || to.ID == old.ID || to.Partitions != 2 {
		t.Fatalf("reset = %s -> %s, %v", from, to, err)
	}
	state("ok")
	for _, k := range []fence.Key{k0, k1} {
		if s, _ := st.Load(ctx, k); s.Token != (fence.Token{Era: 1}) || s.Position != fence.NoPosition {
			t.Fatalf("%s after the reset: %+v, want 1.0 with no position", k, s)
		}
		rs, err := st.Recoveries(ctx, k)
		if err != nil || len(rs) != 1 || rs[0].Reason != "topic recreated by the platform team (by operator:test@host)" {
			t.Fatalf("recoveries of %s: %+v, %v", k, rs, err)
		}
	}

	// Growth: 2 -> 3 partitions.
	if cr, err := adm.CreatePartitions(ctx, 1, "t"); err != nil || cr.Error() != nil {
		t.Fatalf("create partitions: %v %v", err, cr.Error())
	}
	if _, err := st.Claim(ctx, k1, fence.Token{Era: 1, Epoch: 4}, "test"); err != nil {
		t.Fatal(err)
	}
	if err := st.Apply(ctx, k1, fence.Token{Era: 1, Epoch: 4}, 0, 2, func(context.Context, *sql.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	state("grown")
	req.Growth = false
	if _, _, err := c.ResetTopic(ctx, req); !errors.Is(err, status.ErrUsage) {
		t.Fatalf("reset of a grown topic: %v, want ErrUsage", err)
	}
	req.Growth, req.Reason = true, "older partitions drained"
	if from, to, err := c.ResetTopic(ctx, req); err != nil || to.Partitions != 3 || to.ID != from.ID {
		t.Fatalf("ack = %s -> %s, %v", from, to, err)
	}
	state("ok")
	if s, _ := st.Load(ctx, k1); s.Position != 2 {
		t.Fatalf("an acknowledgement moved the fence of %s: %+v", k1, s)
	}

	// Records 3..5 of partition 1 deleted before they were applied (position 2).
	if _, err := adm.DeleteRecords(ctx, kadm.Offsets{"t": {1: {At: 6}}}); err != nil {
		t.Fatal(err)
	}
	// kfake answers GROUP_ID_NOT_FOUND for the offsets of a group it never saw (Kafka answers
	// none): give it one.
	if _, err := adm.CommitOffsets(ctx, "g", kadm.Offsets{"t": {0: {Topic: "t", Partition: 0, At: 0}}}); err != nil {
		t.Fatal(err)
	}
	snap, err := c.Collect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p := snap.Partition("t", 1); p == nil || p.Lost == nil || *p.Lost != 3 {
		t.Fatalf("partition 1: %+v, want 3 records lost", p)
	}
	if p := snap.Partition("t", 0); p == nil || p.Lost != nil {
		t.Fatalf("partition 0: %+v, want no loss (nothing applied since the reset)", p)
	}
	var b bytes.Buffer
	if err := status.WriteText(&b, snap); err != nil || !strings.Contains(b.String(), "DATA LOSS t/1: offsets 3..5") {
		t.Fatalf("text = %q, %v; want the data loss line", b.String(), err)
	}
}
