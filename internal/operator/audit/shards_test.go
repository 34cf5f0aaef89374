package audit_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/shard"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/internal/operator/audit"
	"github.com/batonhq/baton/internal/operator/status"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// TestAuditAcrossShardsRetiredFenceNotJudged: three SQLite shards (a is home) and six
// partitions; one key applied 0..4 on shard b, moved to c (retired on b, its fence seeded on c
// at 4, as the move's copy does) and applied 5..9 there; the group committed 10. Each shard is
// audited, every fence once, on the shard the placement puts it on; the retired fence on b,
// whose position stands at 4, is never judged, with the placement read or not (the home shard
// unreadable): judged, it would read as five records skipped.
func TestAuditAcrossShardsRetiredFenceNotJudged(t *testing.T) {
	ctx := context.Background()
	names := []string{"a", "b", "c"}
	paths := map[string]string{}
	stores := map[string]shard.Shard[*sql.Tx]{}
	var home *sqlitefence.Store
	for _, n := range names {
		paths[n] = filepath.Join(t.TempDir(), n+".db")
		s, err := sqlitefence.Open(paths[n])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		stores[n] = s
		if n == "a" {
			home = s
		}
	}
	pl := shard.SQLite(home.DB())
	must(t, pl.Migrate(ctx))
	must(t, pl.Publish(ctx, shard.Placement{Version: 1, Shards: names}, "three shards"))
	r, err := shard.New(ctx, "a", stores, pl)
	must(t, err)
	brokers := testenv.FakeKafka(t)
	topic, group := testenv.NewTopic(t, brokers, 6), testenv.UniqueName("audit")
	tok := fence.Token{Epoch: 1}
	var moved fence.Key
	for p := range int32(6) {
		k := fence.Key{Group: group, Topic: topic, Partition: p}
		_, err := r.Claim(ctx, k, tok, "member-1")
		must(t, err)
		if moved == (fence.Key{}) && r.Placement().Shard(k) == "b" {
			moved = k
		}
	}
	noop := func(context.Context, *sql.Tx) error { return nil }
	must(t, r.Apply(ctx, moved, tok, 0, 4, noop))
	must(t, r.Move(ctx, moved, "c", nil))
	st, err := r.Load(ctx, moved)
	must(t, err)
	next := fence.Token{Era: st.Token.Era, Epoch: 1}
	_, err = r.Claim(ctx, moved, next, "member-1")
	must(t, err)
	must(t, r.Apply(ctx, moved, next, 5, 9, noop))

	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	must(t, err)
	defer cl.Close()
	offs := kadm.Offsets{}
	offs.Add(kadm.Offset{Topic: topic, Partition: moved.Partition, At: 10, LeaderEpoch: -1})
	must(t, kadm.NewClient(cl).CommitAllOffsets(ctx, group, offs))

	for _, homeDown := range []bool{false, true} {
		var shards []status.ShardAddr
		for _, n := range names {
			p := paths[n]
			if n == "a" && homeDown {
				p = filepath.Join(t.TempDir(), "gone.db")
			}
			shards = append(shards, status.ShardAddr{Name: n, Store: p})
		}
		a, err := audit.New(audit.Config{Brokers: brokers, Shards: shards, Group: group, Timeout: 2 * time.Second,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		must(t, err)
		rep, err := a.Pass(ctx)
		a.Close()
		if homeDown != (err != nil) || (homeDown && (!errors.Is(err, status.ErrUnreachable) || !strings.Contains(err.Error(), "shard a: SQLite file"))) {
			t.Errorf("home shard down %v: err = %v", homeDown, err)
		}
		for _, v := range rep.Violations {
			t.Errorf("home shard down %v: violation: %s", homeDown, v)
		}
		if len(rep.Shards) != 3 {
			t.Fatalf("home shard down %v: %d shard reports, want 3", homeDown, len(rep.Shards))
		}
		for _, s := range rep.Shards {
			want, retired := 2, 0 // two partitions per shard by the rule
			switch {
			case s.Name == "a" && homeDown:
				want = 0
			case s.Name == "b":
				want, retired = 1, 1
			case s.Name == "c":
				want = 3
			}
			if s.Partitions != want || s.Retired != retired {
				t.Errorf("home shard down %v: shard %s judged %d fences with %d retired, want %d and %d", homeDown, s.Name, s.Partitions, s.Retired, want, retired)
			}
		}
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestAuditAcrossShardsRecreatedTopic: two SQLite shards (a is home, the only one storing the
// topic's identity until a reset) hold the fences of a topic's four partitions at position 8;
// the topic is recreated empty. The fences of both shards are of the old incarnation: none is
// judged against the new log, and the report names the topic once with its four fences. Then
// shard b alone is reset (a router's reset does b first, the home shard last): b's fences, in a
// new era with no position, are judged again; a's still are not.
func TestAuditAcrossShardsRecreatedTopic(t *testing.T) {
	ctx := context.Background()
	names := []string{"a", "b"}
	paths := map[string]string{}
	stores := map[string]shard.Shard[*sql.Tx]{}
	for _, n := range names {
		paths[n] = filepath.Join(t.TempDir(), n+".db")
		s, err := sqlitefence.Open(paths[n])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		stores[n] = s
	}
	pl := shard.SQLite(stores["a"].(*sqlitefence.Store).DB())
	must(t, pl.Migrate(ctx))
	must(t, pl.Publish(ctx, shard.Placement{Version: 1, Shards: names}, "two shards"))
	r, err := shard.New(ctx, "a", stores, pl)
	must(t, err)
	brokers := testenv.FakeKafka(t)
	topic, group := testenv.NewTopic(t, brokers, 4), testenv.UniqueName("audit")
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	must(t, err)
	defer cl.Close()
	old := topicIdentity(t, cl, topic)
	_, _, err = r.SeeTopic(ctx, group, topic, old, "first claim")
	must(t, err)
	tok := fence.Token{Epoch: 1}
	onB := 0
	for p := range int32(4) {
		k := fence.Key{Group: group, Topic: topic, Partition: p}
		_, err := r.Claim(ctx, k, tok, "member-1")
		must(t, err)
		must(t, r.Apply(ctx, k, tok, 0, 8, func(context.Context, *sql.Tx) error { return nil }))
		if r.Placement().Shard(k) == "b" {
			onB++
		}
	}
	if onB == 0 || onB == 4 {
		t.Fatalf("%d of 4 partitions on shard b: the test needs fences on both shards", onB)
	}
	a, err := audit.New(audit.Config{Brokers: brokers, Shards: []status.ShardAddr{{Name: "a", Store: paths["a"]}, {Name: "b", Store: paths["b"]}},
		Group: group, Topics: []string{topic}, Timeout: 2 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	must(t, err)
	defer a.Close()
	pass := func(when string) *audit.Report {
		t.Helper()
		rep, err := a.Pass(ctx)
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		for _, v := range rep.Violations {
			t.Errorf("%s: violation: %s", when, v)
		}
		return rep
	}
	pass("the old incarnation")

	adm := kadm.NewClient(cl)
	resp, err := adm.DeleteTopics(ctx, topic)
	if err == nil {
		err = resp.Error()
	}
	must(t, err)
	cr, err := adm.CreateTopic(ctx, 4, 1, nil, topic)
	if err == nil {
		err = cr.Err
	}
	must(t, err)
	next := topicIdentity(t, cl, topic)
	if next.ID == "" || next.ID == old.ID {
		t.Fatalf("topic recreated as %+v, was %+v", next, old)
	}
	want := []audit.RecreatedTopic{{Topic: topic, StoredID: old.ID, BrokerID: next.ID, Fences: 4}}
	for i := range 2 {
		recreatedIs(t, pass(fmt.Sprintf("recreated, pass %d", i)), want)
	}

	b := stores["b"].(*sqlitefence.Store)
	_, _, err = b.SeeTopic(ctx, group, topic, old, "reset")
	must(t, err)
	must(t, b.ResetTopic(ctx, group, topic, old, next, "recreated by the test"))
	want[0].Fences = 4 - onB
	for i := range 2 {
		recreatedIs(t, pass(fmt.Sprintf("shard b reset, pass %d", i)), want)
	}
}
