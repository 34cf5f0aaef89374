package audit_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/operator/audit"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/outboxconsumer"
)

// A consumer applying normally with its relay, and a receiver admitting the copies through its
// inbox, audited all along: no violation (the consumer's claimant is its owner's: the
// ownership check matched them), every source partition caught up, and the auditor's
// load bounded: a fixed number of statements per pass, and the output topic read once.
func TestCleanRunReportsNothing(t *testing.T) {
	both(t, func(t *testing.T, e *env) { e.cleanRun(t) })
}

// runClean runs the source group (each record appends one command to the output topic, relayed
// after each commit) and a receiver group admitting the commands through an inbox, on the
// same store, until ctx ends.
func runClean[Tx any](ctx context.Context, t *testing.T, e *env, sink fence.Sink[Tx], keyed fence.KeyedSink[Tx], box outbox.Appender[Tx]) (wait func()) {
	kopts := []kgo.Opt{kgo.SeedBrokers(e.brokers...), kgo.FetchMaxWait(100 * time.Millisecond), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}
	src, err := consumer.New(e.group, []string{e.src}, sink, func(ctx context.Context, tx Tx, b *consumer.Batch) error {
		var msgs []outbox.Message
		for _, r := range b.Records {
			msgs = append(msgs, outbox.Message{Topic: e.dest, Key: r.Key, Value: r.Value})
		}
		return box.Append(ctx, tx, b.Key, b.Token, msgs...)
	}, consumer.Kafka(kopts...), consumer.AfterCommit(e.relay.AfterCommit(), 100*time.Millisecond),
		consumer.Logger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	in, err := outbox.NewInbox("receiver", keyed)
	if err != nil {
		t.Fatal(err)
	}
	recv, err := consumer.New(e.group+"_recv", []string{e.dest}, sink, outboxconsumer.Handler(in, func(context.Context, Tx, *consumer.Batch) error { return nil }),
		consumer.Kafka(kopts...), consumer.Logger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, c := range []*consumer.Consumer[Tx]{src, recv} {
		wg.Go(func() {
			if err := c.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("Run: %v", err)
			}
		})
	}
	return wg.Wait
}

func (e *env) cleanRun(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	wait := e.run(ctx, t)
	defer wait()
	defer cancel()
	a, _ := e.auditor(t, func(c *audit.Config) { c.Now = time.Now })
	var queries []int64
	produced := int64(0)
	deadline := time.Now().Add(60 * time.Second)
	caughtUp := false
	owned := 0
	for time.Now().Before(deadline) {
		if produced < 200 {
			produced = e.produce(t, 20)
		}
		r := clean(t, a, fmt.Sprintf("a clean run, %d records produced", produced))
		queries = append(queries, r.Queries)
		owned = max(owned, r.Owned)
		last, _ := a.Last()
		if produced >= 200 && r.CaughtUp && e.delivered(t) == 200 && last.New == 0 {
			caughtUp = true
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !caughtUp {
		t.Fatalf("the run did not catch up within 60s (delivered %d of 200)", e.delivered(t))
	}
	if owned == 0 {
		t.Error("no pass compared the fence's claimant with the group's owner: the consumer's claimant did not match its member, or the group was never seen stable")
	}
	for _, q := range queries {
		if q > maxQueriesPerPass {
			t.Errorf("a pass sent %d statements to the store, want at most %d (passes: %v)", q, maxQueriesPerPass, queries)
		}
	}
	// Nothing new on the output topic: the next pass reads nothing from it.
	clean(t, a, "caught up")
	if r := clean(t, a, "caught up, again"); r.BytesRead != 0 || !r.CaughtUp {
		t.Errorf("a pass with nothing new read %d bytes (caught up %v), want 0: the output topics are read incrementally", r.BytesRead, r.CaughtUp)
	}
}

// maxQueriesPerPass: fences and recoveries (an existence check and a read each), the stored
// topic identities (an existence check and a read per source topic: one here), the outbox
// cursors (two checks and a read), the dead letters (a check and a read), the inbox page (a
// check and a read).
const maxQueriesPerPass = 13
