package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/outboxconsumer"
)

// gateway is the device side: it consumes the commands and applies each one to the device
// exactly once. Its own SQLite file holds what it applied and the inbox's admissions, written
// in one transaction: a relay's re-published copy or a deposed owner's late command is dropped.
type gateway struct {
	store *sqlitefence.Store
	db    *sql.DB
	*member
}

func startGateway(ctx context.Context, brokers []string, path string) (*gateway, error) {
	store, err := sqlitefence.Open(path)
	if err != nil {
		return nil, err
	}
	g := &gateway{store: store, db: store.DB()}
	if _, err := g.db.ExecContext(ctx, `CREATE TABLE applied
  (command_id TEXT PRIMARY KEY, device TEXT NOT NULL, set_temp REAL, times INTEGER NOT NULL)`); err != nil {
		store.Close()
		return nil, err
	}
	inbox, err := outbox.NewInbox("gateway", fence.KeyedSink[*sql.Tx](store))
	if err != nil {
		store.Close()
		return nil, err
	}
	// apply sees only the records the inbox admitted, in the transaction that admitted them.
	apply := consumer.HandlerFunc[*sql.Tx](func(ctx context.Context, tx *sql.Tx, b *consumer.Batch) error {
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
			if _, err := tx.ExecContext(ctx, `INSERT INTO applied VALUES (?, ?, ?, 1)
ON CONFLICT (command_id) DO UPDATE SET times = times + 1`, env.IdempotencyKey, c.Device, c.SetTemp); err != nil {
				return err
			}
		}
		return nil
	})
	factory := func(context.Context, fence.Key, fence.Token) (consumer.Handler[*sql.Tx], error) {
		return outboxconsumer.Handler(inbox, apply), nil
	}
	m, err := startMember(ctx, "gateway", commandsTopic, brokers, store, factory, nil)
	if err != nil {
		store.Close()
		return nil, err
	}
	m.onStop = func() { store.Close() }
	g.member = m
	return g, nil
}

func (g *gateway) appliedAtLeast(n int) func() bool {
	return func() bool {
		var k int
		return g.db.QueryRow(`SELECT count(*) FROM applied`).Scan(&k) == nil && k >= n
	}
}

// republishOne re-publishes the first command verbatim, as a relay does when it crashes
// between the broker's acknowledgement and marking the rows delivered, waits until the
// gateway has consumed the copy (its fence passed the copy's offset), and checks that the
// command was still applied only once.
func republishOne(ctx context.Context, out *syncWriter, brokers []string, g *gateway) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(commandsTopic),
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
	k := fence.Key{Group: "gateway", Topic: commandsTopic, Partition: copied.Partition}
	if err := waitFor(ctx, func() bool {
		st, err := g.store.Load(ctx, k)
		return err == nil && st.Position >= copied.Offset
	}); err != nil {
		return fmt.Errorf("waiting for the gateway to consume the copy: %w", err)
	}
	var times int
	if err := g.db.QueryRowContext(ctx, `SELECT times FROM applied WHERE command_id = ?`, env.IdempotencyKey).Scan(&times); err != nil {
		return err
	}
	if times != 1 {
		return fmt.Errorf("command %s applied %d times", env.IdempotencyKey, times)
	}
	out.say("command %s re-published (as after a relay crash): the gateway's inbox dropped the copy", env.IdempotencyKey)
	return nil
}
