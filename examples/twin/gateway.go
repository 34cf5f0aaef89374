package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/outboxconsumer"
)

// gateway is the device side: it consumes the commands and applies each one to the device
// exactly once. Its store (its own SQLite file in the embedded run) holds what it applied and
// the inbox's admissions, written in one transaction: a relay's re-published copy or a deposed
// owner's late command is dropped.
type gateway struct {
	db   sqlDB
	load func(context.Context, fence.Key) (fence.State, error)
	*member
}

func startGateway[Tx any](ctx context.Context, o options, brokers []string, n names, st *store[Tx]) (*gateway, error) {
	inbox, err := outbox.NewInbox[Tx](n.gateway, st.sink)
	if err != nil {
		return nil, err
	}
	// apply sees only the records the inbox admitted, in the transaction that admitted them.
	apply := consumer.Handler[Tx](func(ctx context.Context, tx Tx, b *consumer.Batch) error {
		for _, r := range b.Records {
			env, err := outbox.ParseEnvelope(r) // the inbox admitted it, so this does not fail
			if err != nil {
				return b.Fail(r, err)
			}
			var c command
			if err := json.Unmarshal(r.Value, &c); err != nil {
				return b.Fail(r, err)
			}
			// A real gateway would send the command to the device here, with
			// env.IdempotencyKey; times counts applications, and must end at 1.
			if err := st.wrap(tx).Exec(ctx, `INSERT INTO applied VALUES ($1, $2, $3, 1)
ON CONFLICT (command_id) DO UPDATE SET times = applied.times + 1`, env.IdempotencyKey, c.Device, c.SetTemp); err != nil {
				return err
			}
		}
		return nil
	})
	factory := func(context.Context, fence.Key, fence.Token) (consumer.Handler[Tx], error) {
		return outboxconsumer.Handler(inbox, apply), nil
	}
	// A command the gateway refuses for good is dead-lettered with its admission, so a copy of
	// it that the relay re-publishes is a duplicate too.
	m, err := startMember(ctx, o, n.gateway, n.commands, brokers, fence.Sink[Tx](st.sink), factory, nil,
		outboxconsumer.AdmitDeadLetters(inbox))
	if err != nil {
		return nil, err
	}
	return &gateway{db: st.db, load: st.sink.Load, member: m}, nil
}

func (g *gateway) appliedAtLeast(n int) func() bool {
	return func() bool {
		var k int
		return g.db.QueryRow(context.Background(), `SELECT count(*) FROM applied`).Scan(&k) == nil && k >= n
	}
}

// republishOne re-publishes the first command verbatim, as a relay does when it crashes
// between the broker's acknowledgement and marking the rows delivered, waits until the
// gateway has consumed the copy (its fence passed the copy's offset), and checks that the
// command was still applied only once.
func republishOne(ctx context.Context, out *syncWriter, brokers []string, n names, g *gateway) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(n.commands),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return err
	}
	defer cl.Close()
	fs := cl.PollRecords(ctx, 1)
	if err := fs.Err0(); err != nil {
		return err
	}
	recs := fs.Records()
	if len(recs) == 0 {
		return fmt.Errorf("no command to re-publish")
	}
	env, err := outbox.ParseEnvelope(recs[0])
	if err != nil {
		return err
	}
	r := recs[0]
	copied, err := cl.ProduceSync(ctx, &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Headers: r.Headers}).First()
	if err != nil {
		return err
	}
	k := fence.Key{Group: n.gateway, Topic: n.commands, Partition: copied.Partition}
	if err := waitFor(ctx, func() bool {
		st, err := g.load(ctx, k)
		return err == nil && st.Position >= copied.Offset
	}); err != nil {
		return fmt.Errorf("waiting for the gateway to consume the copy: %w", err)
	}
	var times int
	if err := g.db.QueryRow(ctx, `SELECT times FROM applied WHERE command_id = $1`, env.IdempotencyKey).Scan(&times); err != nil {
		return err
	}
	if times != 1 {
		return fmt.Errorf("command %s applied %d times", env.IdempotencyKey, times)
	}
	out.say("command %s re-published (as after a relay crash): the gateway's inbox dropped the copy", env.IdempotencyKey)
	return nil
}
