package sqliteoutbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/outbox"
)

// One receiver reads two destination topics with one inbox, and reads them out of order:
// every record of topic "b" before any of topic "a". The source's sequences rise across both
// topics (a1 b2 a3 b4 ...), so an admission scoped by (receiver, source, key) alone stores b's
// seq 8 first and then drops a1, a3, a5, a7 as duplicates although they were never applied.
// Scoped by the destination topic and partition too, every record is
// applied exactly once, and a second delivery of everything, in the other order, is dropped.
func TestInboxTwoDestinationTopicsOutOfOrder(t *testing.T) {
	ctx, fences, store := open(t)
	bs := testenv.FakeKafka(t, kfake.SeedTopics(1, "a", "b"))
	tok := fence.Token{Epoch: 1}
	if _, err := fences.Claim(ctx, src, tok, "test"); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 4 {
		sa, sb := fmt.Sprintf("a%d", 2*i+1), fmt.Sprintf("b%d", 2*i+2)
		want = append(want, sa, sb)
		err := fences.Apply(ctx, src, tok, int64(i), int64(i), func(ctx context.Context, tx *sql.Tx) error {
			return store.Append(ctx, tx, src, tok,
				outbox.Message{Topic: "a", Key: []byte("k"), Value: []byte(sa)},
				outbox.Message{Topic: "b", Key: []byte("k"), Value: []byte(sb)})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(bs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	relay, err := outbox.NewRelay(cl, store)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := relay.Flush(ctx, src, tok); err != nil || n != 8 {
		t.Fatalf("Flush = %d, %v; want 8", n, err)
	}
	recsA, recsB := consumeAll(ctx, t, bs, "a", 4), consumeAll(ctx, t, bs, "b", 4)

	in, err := outbox.NewInbox[*sql.Tx]("receiver", fences)
	if err != nil {
		t.Fatal(err)
	}
	applied := map[string]int{}
	admit := func(rec *kgo.Record) fence.Verdict {
		t.Helper()
		tx, err := fences.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback() }()
		v, err := in.Admit(ctx, tx, rec)
		if err != nil {
			t.Fatalf("Admit(%s %q): %v", rec.Topic, rec.Value, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if v == fence.Admitted {
			applied[string(rec.Value)]++
		}
		return v
	}
	for _, rec := range slices.Concat(recsB, recsA) { // b before a: out of the source's order
		if v := admit(rec); v != fence.Admitted {
			t.Errorf("first delivery of %s %q: %s, want admitted (it was never applied)", rec.Topic, rec.Value, v)
		}
	}
	for _, rec := range slices.Concat(recsA, recsB) { // every record again: a relay re-publish
		if v := admit(rec); v != fence.Duplicate {
			t.Errorf("second delivery of %s %q: %s, want duplicate", rec.Topic, rec.Value, v)
		}
	}
	for _, v := range want {
		if applied[v] != 1 {
			t.Errorf("%s applied %d times, want exactly once (applied: %v)", v, applied[v], applied)
		}
	}
}

// consumeAll reads n records of topic from the start.
func consumeAll(ctx context.Context, t *testing.T, bs []string, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(bs...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < n && ctx.Err() == nil {
		recs = append(recs, cl.PollFetches(ctx).Records()...)
	}
	if len(recs) != n {
		t.Fatalf("read %d records of %s, want %d", len(recs), topic, n)
	}
	return recs
}
