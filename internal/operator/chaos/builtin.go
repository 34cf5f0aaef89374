package chaos

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/outbox"
)

// commandsTopic is the built-in workload's commands topic suffix; commandsTopic2 the second
// destination topic's, with Workload.CommandTopics = 2.
const (
	commandsTopic  = "commands"
	commandsTopic2 = "commands2"
)

// commandTopics lists the destination topics' suffixes.
func (b *builtin) commandTopics() []string {
	if b.w.CommandTopics > 1 {
		return []string{commandsTopic, commandsTopic2}
	}
	return []string{commandsTopic}
}

// commands returns the messages a batch sends: Workload.CommandsFor, with CommandTopics = 2
// every other command of a key (by sequence) routed to the second topic, so one source
// partition's sequences rise across both topics and the receiver reads them in two streams.
func (b *builtin) commands(src string, recs []*kgo.Record) []outbox.Message {
	msgs := b.w.CommandsFor(topicName(src, commandsTopic), recs)
	if b.w.CommandTopics > 1 {
		for i, m := range msgs {
			if seq, err := strconv.ParseInt(string(m.Value), 10, 64); err == nil && (seq/int64(b.w.CommandEvery))%2 == 1 {
				msgs[i].Topic = topicName(src, commandsTopic2)
			}
		}
	}
	return msgs
}

// builtin is the built-in workload as an [App]: the keyed stream of [Workload], folded by a
// deliberately naive read-modify-write into chaos_state; with CommandEvery > 0 in fenced mode,
// commands through the outbox to a device gateway that applies them through the inbox into
// chaos_commands. Its checks fill the Verdict's record and command counts.
//
// Lock mode runs it too, with RunBaseline's workers (the lease is per partition of the
// one topic); fenced and unfenced workers run it as any App.
type builtin struct {
	w      Workload
	mode   Mode
	rounds atomic.Int64 // rounds produced (the harness's process)

	// The producer's pause (the topic faults): while hold is not nil the producer stops
	// between rounds (everything it produced acknowledged) and closes parked.
	mu     sync.Mutex
	hold   chan struct{} // closed by resume
	parked chan struct{} // closed by the producer once it stopped
	isPark bool
}

func newBuiltin(w Workload, mode Mode) *builtin {
	if mode != Fenced {
		w.CommandEvery = 0 // commands need the outbox
	}
	return &builtin{w: w, mode: mode}
}

// Name implements App. The built-in workload is the one a worker runs without -app.
func (*builtin) Name() string { return "" }

// Topics implements App.
func (b *builtin) Topics() []string {
	if b.w.CommandEvery > 0 {
		return append([]string{""}, b.commandTopics()...)
	}
	return []string{""}
}

// Migrate implements App.
func (*builtin) Migrate(ctx context.Context, env AppEnv) error { return Migrate(ctx, env.DB) }

// Consumers implements App: the fold (and its commands) in the run's group, the gateway in
// <group>-gateway.
func (b *builtin) Consumers(context.Context, AppEnv) ([]AppConsumer, func(), error) {
	w := b.w
	cs := []AppConsumer{{Topics: []string{""}, Factory: func(context.Context, fence.Key, fence.Token) (AppHandler, error) {
		return func(ctx context.Context, tx Tx, ab *AppBatch) error {
			if err := fold(ctx, tx, ab.Records); err != nil {
				return err
			}
			return ab.Append(ctx, b.commands(ab.Key.Topic, ab.Records)...)
		}, nil
	}}}
	if w.CommandEvery > 0 {
		cs = append(cs, AppConsumer{Name: "gateway", Topics: b.commandTopics(), Inbox: true,
			Factory: func(context.Context, fence.Key, fence.Token) (AppHandler, error) {
				return func(ctx context.Context, tx Tx, ab *AppBatch) error {
					for _, r := range ab.Records {
						seq, err := strconv.ParseInt(string(r.Value), 10, 64)
						if err != nil {
							return ab.Fail(r, err)
						}
						if err := tx.Exec(ctx, `INSERT INTO chaos_commands (k, seq, topic) VALUES ($1, $2, $3)`, string(r.Key), seq, r.Topic); err != nil {
							return err
						}
					}
					return nil
				}, nil
			}})
	}
	return cs, nil, nil
}

// Produce implements App: round after round (one record per key) until stop, and at least
// PerKey rounds.
func (b *builtin) Produce(ctx context.Context, env AppEnv, cl *kgo.Client, rate int, stop <-chan struct{}) error {
	topic := env.Topic("")
	rounds := 0
	defer func() { b.rounds.Store(int64(rounds)) }()
	for {
		b.mu.Lock()
		hold := b.hold
		if hold != nil && !b.isPark {
			b.isPark = true
			close(b.parked)
		}
		b.mu.Unlock()
		if hold != nil {
			select {
			case <-hold:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		select {
		case <-stop:
			if rounds >= b.w.PerKey {
				return nil
			}
		default:
		}
		w := b.w
		if err := w.Produce(ctx, cl, topic, rounds*w.Keys, (rounds+1)*w.Keys, rate); err != nil {
			return err
		}
		rounds++
		b.rounds.Store(int64(rounds))
	}
}

// pause stops the producer after the round it is in and waits until everything it produced is
// acknowledged (at most wait); resume lets it go on.
func (b *builtin) pause(ctx context.Context, wait time.Duration) error {
	b.mu.Lock()
	if b.hold == nil {
		b.hold, b.parked, b.isPark = make(chan struct{}), make(chan struct{}), false
	}
	parked := b.parked
	b.mu.Unlock()
	select {
	case <-parked:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(wait):
		return fmt.Errorf("the producer did not stop within %s", wait)
	}
}

func (b *builtin) resume() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.hold != nil {
		close(b.hold)
		b.hold = nil
	}
}

// workload is the workload as it was actually run.
func (b *builtin) workload() Workload {
	w := b.w
	w.PerKey = int(b.rounds.Load())
	return w
}

// Settled implements App: every command the workload sent was applied (the harness waits for
// the records themselves).
func (b *builtin) Settled(ctx context.Context, env AppEnv) (bool, error) {
	w := b.workload()
	if w.CommandEvery <= 0 {
		return true, nil
	}
	var n int64
	if err := env.DB.QueryRow(ctx, `SELECT count(*) FROM chaos_commands`).Scan(&n); err != nil {
		return false, err
	}
	return n >= int64(w.Commands()*w.Keys), nil
}

// Check implements App: the built-in workload has no invariants of its own beyond the
// Verdict's record and command counts, which verdict fills.
func (*builtin) Check(context.Context, AppEnv) ([]Invariant, error) { return nil, nil }

// verdict fills v's record and command counts.
func (b *builtin) verdict(ctx context.Context, env AppEnv, v *Verdict) error {
	w := b.workload()
	v.Expected = int64(w.Total())
	if err := checkFold(ctx, env.DB, w, v); err != nil {
		return err
	}
	if w.CommandEvery > 0 {
		return checkCommands(ctx, env.DB, w, v)
	}
	return nil
}
