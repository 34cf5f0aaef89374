package outbox_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
	"github.com/batonhq/baton/outbox"
)

// relayed is a record as the relay publishes it, read from topic/partition.
func relayed(topic string, partition int32, src fence.Key, tok fence.Token, seq int64, key string) *kgo.Record {
	return &kgo.Record{Topic: topic, Partition: partition, Key: []byte(key), Value: []byte(strconv.FormatInt(seq, 10)),
		Headers: []kgo.RecordHeader{
			{Key: "baton-token", Value: []byte(tok.String())},
			{Key: "baton-seq", Value: []byte(strconv.FormatInt(seq, 10))},
			{Key: "baton-source", Value: []byte(src.String())},
		}}
}

// The inbox admits each (source, destination, key) sequence once, in (token, seq) order: a
// copy or an older sequence is a duplicate, an older owner's record is stale, and the same
// sequence read from another destination topic or partition is admitted there.
func TestInboxAdmitsEachRecordOnce(t *testing.T) {
	store, err := memfence.New()
	if err != nil {
		t.Fatal(err)
	}
	in, err := outbox.NewInbox[*memfence.Tx]("receiver", store)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	src := fence.Key{Group: "g", Topic: "orders", Partition: 0}
	old, cur := fence.Token{Epoch: 1}, fence.Token{Epoch: 2}
	for i, c := range []struct {
		rec  *kgo.Record
		want fence.Verdict
	}{
		{relayed("invoices", 0, src, cur, 1, "k"), fence.Admitted},
		{relayed("invoices", 0, src, cur, 1, "k"), fence.Duplicate}, // a relay's copy
		{relayed("invoices", 0, src, cur, 3, "k"), fence.Admitted},
		{relayed("invoices", 0, src, cur, 2, "k"), fence.Duplicate}, // at or below the admitted one
		{relayed("invoices", 0, src, old, 9, "k"), fence.Stale},     // a deposed owner's
		{relayed("invoices", 0, src, cur, 1, "j"), fence.Admitted},  // another key
		{relayed("receipts", 0, src, cur, 2, "k"), fence.Admitted},  // another destination topic, read later
		{relayed("invoices", 1, src, cur, 2, "k"), fence.Admitted},  // another destination partition
		{relayed("receipts", 0, src, cur, 2, "k"), fence.Duplicate},
	} {
		tx, err := store.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		v, err := in.Admit(ctx, tx, c.rec)
		if err == nil {
			err = tx.Commit()
		} else {
			_ = tx.Rollback()
		}
		if err != nil || v != c.want {
			t.Errorf("admission %d (%s/%d seq %s key %s): %v, %v; want %v", i, c.rec.Topic, c.rec.Partition, c.rec.Value, c.rec.Key, v, err, c.want)
		}
	}
}

// A relay whose source partition was taken over publishes nothing, marks nothing and reports
// the refusal as a *fence.StaleError naming its own token, from Flush and from the AfterCommit
// hook (which the consumer turns into a re-claim); the new owner's relay then delivers every
// row, with the token it was appended under.
func TestDeposedRelayPublishesNothing(t *testing.T) {
	e := newRelayEnv(t, []kfake.Opt{kfake.SeedTopics(1, "dest")}, nil, outbox.FlushTimeout(2*time.Second))
	for i := range 3 {
		e.append(t, outbox.Message{Topic: "dest", Key: []byte("k"), Value: []byte(strconv.Itoa(i))})
	}
	next := fence.Token{Epoch: e.tok.Epoch + 1}
	if _, err := e.fences.Claim(e.ctx, e.src, next, "successor"); err != nil {
		t.Fatal(err)
	}
	stale := func(what string, err error) {
		t.Helper()
		var se *fence.StaleError
		if !errors.As(err, &se) || se.Key != e.src || se.Presented != e.tok || se.Stored != next {
			t.Errorf("%s after the takeover = %v; want a *fence.StaleError presenting %s, stored %s", what, err, e.tok, next)
		}
	}
	n, err := e.relay.Flush(e.ctx, e.src, e.tok)
	if n != 0 {
		t.Errorf("the deposed relay's Flush delivered %d rows", n)
	}
	stale("the deposed relay's Flush", err)
	stale("the deposed relay's AfterCommit", e.relay.AfterCommit()(e.ctx, e.src, e.tok))
	// Nothing reached the topic: read it for a while.
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.ConsumeTopics("dest"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var got []*kgo.Record
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		pctx, cancel := context.WithTimeout(e.ctx, 300*time.Millisecond)
		got = append(got, cl.PollFetches(pctx).Records()...)
		cancel()
	}
	if len(got) != 0 {
		t.Fatalf("the deposed relay published %d records", len(got))
	}
	if rows, err := e.box.Pending(e.ctx, e.src, next, 10); err != nil || len(rows) != 3 {
		t.Fatalf("pending under the owner's token: %d rows, %v; want all 3 (nothing marked)", len(rows), err)
	}
	if n, err := e.relay.Flush(e.ctx, e.src, next); err != nil || n != 3 {
		t.Fatalf("the owner's Flush = %d, %v; want 3", n, err)
	}
	for len(got) < 3 && e.ctx.Err() == nil {
		got = append(got, cl.PollFetches(e.ctx).Records()...)
	}
	for i, r := range got {
		env, err := outbox.ParseEnvelope(r)
		if err != nil || env.Seq != int64(i+1) || env.Token != e.tok {
			t.Errorf("record %d: %+v, %v; want seq %d under %s", i, env, err, i+1, e.tok)
		}
	}
}
