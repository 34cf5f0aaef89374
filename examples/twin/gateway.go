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
	"github.com/batonhq/baton/partition"
)

// gateway is the device side: it consumes the commands and applies each one to the device
// exactly once. Its own SQLite file holds what it applied and the inbox's admissions, written
// in one transaction: a relay's re-published copy or a deposed owner's late command is dropped.
type gateway struct {
	store *sqlitefence.Store
	db    *sql.DB
	*member
}

func startGateway(ctx context.Context, out *syncWriter, brokers []string, path string) (*gateway, error) {
	store, err := sqlitefence.Open(path)
	if err != nil {
		return nil, err
	}
	g := &gateway{store: store, db: store.DB()}
	if _, err := g.db.ExecContext(ctx, `
CREATE TABLE applied (command_id TEXT PRIMARY KEY, device TEXT NOT NULL, set_temp REAL, times INTEGER NOT NULL);
CREATE TABLE dropped (command_id TEXT NOT NULL, verdict TEXT NOT NULL)`); err != nil {
		store.Close()
		return nil, err
	}
	inbox, err := outbox.NewInbox("gateway", fence.KeyedSink[*sql.Tx](store))
	if err != nil {
		store.Close()
		return nil, err
	}
	handle := func(ctx context.Context, tx *sql.Tx, b *consumer.Batch) error {
		for _, r := range b.Records {
			env, err := outbox.ParseEnvelope(r)
			if err != nil {
				return b.Fail(r, err)
			}
			verdict, err := inbox.Admit(ctx, tx, r)
			if err != nil {
				return err
			}
			if verdict != fence.Admitted {
				if _, err := tx.ExecContext(ctx, `INSERT INTO dropped VALUES (?, ?)`, env.IdempotencyKey, verdict.String()); err != nil {
					return err
				}
				continue
			}
			var c command
			if err := json.Unmarshal(r.Value, &c); err != nil {
				return b.Fail(r, err)
			}
			// "Apply" the command: a real gateway would talk to the device here, passing
			// env.IdempotencyKey along; times counts applications, and must end at 1.
			if _, err := tx.ExecContext(ctx, `INSERT INTO applied VALUES (?, ?, ?, 1)
ON CONFLICT (command_id) DO UPDATE SET times = times + 1`, env.IdempotencyKey, c.Device, c.SetTemp); err != nil {
				return err
			}
		}
		return nil
	}
	factory := func(context.Context, partition.ID, fence.Token) (consumer.Handler[*sql.Tx], error) {
		return consumer.HandlerFunc[*sql.Tx](handle), nil
	}
	m, err := startMember(ctx, "gateway", commandsTopic, brokers, store, factory)
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
// between the broker's acknowledgement and marking the rows delivered, and waits until the
// gateway's inbox drops the copy.
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
	r := recs[0]
	env, err := outbox.ParseEnvelope(r)
	if err != nil {
		return err
	}
	copyRec := &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Headers: r.Headers}
	if err := cl.ProduceSync(ctx, copyRec).FirstErr(); err != nil {
		return err
	}
	if err := waitFor(ctx, func() bool {
		var n int
		return g.db.QueryRow(`SELECT count(*) FROM dropped WHERE command_id = ?`, env.IdempotencyKey).Scan(&n) == nil && n > 0
	}); err != nil {
		return fmt.Errorf("waiting for the inbox to drop the copy: %w", err)
	}
	out.say("command %s re-published (as after a relay crash): the gateway's inbox dropped the copy", env.IdempotencyKey)
	return nil
}
