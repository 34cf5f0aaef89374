package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/sqliteoutbox"
)

const (
	updatesTopic  = "device-updates"
	commandsTopic = "device-commands"
	group         = "twins"
	devices       = 8
	perDevice     = 12 // updates per device; every third one is a desired-state change
	desiredTotal  = devices * (perDevice / 3)
)

// update is what a device (or its app) sends.
type update struct {
	Device string  `json:"device"`
	Kind   string  `json:"kind"` // "reported" or "desired"
	Temp   float64 `json:"temp"`
	Seq    int     `json:"seq"`
}

// command is what leaves through the outbox for the device.
type command struct {
	Device  string  `json:"device"`
	SetTemp float64 `json:"set_temp"`
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "twin:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, w io.Writer) error {
	out := &syncWriter{w: w}
	dir, err := os.MkdirTemp("", "baton-twin-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1),
		kfake.SeedTopics(4, updatesTopic, updatesTopic+".dlq"), kfake.SeedTopics(2, commandsTopic),
		kfake.BrokerConfigs(map[string]string{"group.min.session.timeout.ms": "500"}))
	if err != nil {
		return err
	}
	defer kafka.Close()
	brokers := kafka.ListenAddrs()
	out.say("Kafka: embedded (kfake); store: SQLite in %s", dir)

	// The twins, their fences and their outbox live in one SQLite file.
	store, err := sqlitefence.Open(filepath.Join(dir, "twins.db"))
	if err != nil {
		return err
	}
	defer store.Close()
	if _, err := store.DB().ExecContext(ctx, `CREATE TABLE twins (device TEXT PRIMARY KEY,
  reported REAL, desired REAL, version INTEGER NOT NULL, last_seq INTEGER NOT NULL)`); err != nil {
		return err
	}
	ob, err := sqliteoutbox.New(store.DB())
	if err == nil {
		err = ob.Migrate(ctx)
	}
	if err != nil {
		return err
	}

	gw, err := startGateway(ctx, brokers, filepath.Join(dir, "gateway.db"))
	if err != nil {
		return err
	}
	defer gw.stop()

	// Member A runs behind a gate (to hold one write) and a freezer (to stop its network).
	gate, freeze := newGate[*sql.Tx](store), newFreezer()
	a, err := startTwinMember(ctx, out, "A", brokers, gate, ob, kgo.Dialer(freeze.dial))
	if err != nil {
		return err
	}
	defer func() { gate.open(); freeze.thaw(); a.stop() }() // a member stops after its in-flight batch
	if err := produceUpdates(ctx, brokers, 1, 6); err != nil {
		return err
	}
	if err := waitFor(ctx, twinsAt(store.DB(), 6)); err != nil {
		return fmt.Errorf("waiting for A to apply the first updates: %w", err)
	}
	out.say("member A folded updates 1-6 of every device")

	gate.arm()
	if err := produceUpdates(ctx, brokers, 7, 7); err != nil {
		return err
	}
	select {
	case <-gate.held:
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(30 * time.Second):
		return errors.New("member A never reached its next write")
	}
	freeze.freeze()
	out.say("member A is about to write a batch of %s and freezes (no heartbeats, no fetches), like a GC pause or a stopped VM", gate.heldKey())

	b, err := startTwinMember(ctx, out, "B", brokers, store, ob)
	if err != nil {
		return err
	}
	defer b.stop()
	defer out.setQuiet(true) // first of the deferred calls
	if err := produceUpdates(ctx, brokers, 8, perDevice); err != nil {
		return err
	}
	if err := waitFor(ctx, twinsAt(store.DB(), perDevice)); err != nil {
		return fmt.Errorf("waiting for B to take over: %w", err)
	}
	out.say("member B took over after A's session expired and folded every update, A's held batch included")

	out.say("member A wakes up, still believing it owns %s, and writes its held batch", gate.heldKey())
	if err := gate.release(); errors.Is(err, fence.ErrStale) {
		out.say("zombie write refused: stale token (%v)", err)
	} else {
		return fmt.Errorf("the zombie's write returned %v, want a stale refusal", err)
	}
	freeze.thaw()

	if err := waitFor(ctx, gw.appliedAtLeast(desiredTotal)); err != nil {
		return fmt.Errorf("waiting for the gateway to apply every command: %w", err)
	}
	out.say("the gateway applied %d commands", desiredTotal)
	if err := republishOne(ctx, out, brokers, gw); err != nil {
		return err
	}

	out.say("")
	if err := printTwins(ctx, out, store.DB()); err != nil {
		return err
	}
	// A may also have fetched batches of other partitions before it froze: refused alike.
	return verdict(ctx, out, store.DB(), gw.db, int(gate.refused.Load()))
}

// startTwinMember starts a member of the twins group writing through sink. After each
// committed batch (and every second while idle) the partition's own goroutine relays the
// partition's outbox under its token, so only the current owner publishes and marks its rows.
func startTwinMember(ctx context.Context, out *syncWriter, name string, brokers []string, sink fence.Sink[*sql.Tx],
	ob *sqliteoutbox.Store, extra ...kgo.Opt) (*member, error) {
	producer, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, extra...)...)
	if err != nil {
		return nil, err
	}
	relay, err := outbox.NewRelay(producer, ob)
	if err != nil {
		producer.Close()
		return nil, err
	}
	factory := func(_ context.Context, k fence.Key, t fence.Token) (consumer.Handler[*sql.Tx], error) {
		out.say("member %s owns %s/%d with token %s", name, k.Topic, k.Partition, t)
		return fold(ob), nil
	}
	m, err := startMember(ctx, group, updatesTopic, brokers, sink, factory, extra,
		consumer.AfterCommit(relay.AfterCommit(), time.Second))
	if err != nil {
		producer.Close()
		return nil, err
	}
	m.onStop = producer.Close
	return m, nil
}

// fold is the twins' handler: it folds a batch into the twins table and appends a command for
// every desired-state change to the outbox, in the fenced transaction.
func fold(ob *sqliteoutbox.Store) consumer.Handler[*sql.Tx] {
	return consumer.HandlerFunc[*sql.Tx](func(ctx context.Context, tx *sql.Tx, b *consumer.Batch) error {
		var cmds []outbox.Message
		for _, r := range b.Records {
			var u update
			if err := json.Unmarshal(r.Value, &u); err != nil {
				return b.Fail(r, err) // a poison record goes to device-updates.dlq
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO twins (device, reported, desired, version, last_seq)
VALUES (?1, iif(?2 = 'reported', ?3, NULL), iif(?2 = 'desired', ?3, NULL), 1, ?4)
ON CONFLICT (device) DO UPDATE SET
  reported = iif(?2 = 'reported', ?3, reported), desired = iif(?2 = 'desired', ?3, desired),
  version = version + 1, last_seq = ?4`, u.Device, u.Kind, u.Temp, u.Seq); err != nil {
				return err
			}
			if u.Kind == "desired" {
				v, err := json.Marshal(command{Device: u.Device, SetTemp: u.Temp})
				if err != nil {
					return err
				}
				cmds = append(cmds, outbox.Message{Topic: commandsTopic, Key: r.Key, Value: v})
			}
		}
		return ob.Append(ctx, tx, b.Key, b.Token, cmds...) // checks the fence too
	})
}

// produceUpdates sends updates from..to of every device, keyed by device id.
func produceUpdates(ctx context.Context, brokers []string, from, to int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(updatesTopic))
	if err != nil {
		return err
	}
	defer cl.Close()
	var recs []*kgo.Record
	for seq := from; seq <= to; seq++ {
		for d := range devices {
			u := update{Device: fmt.Sprintf("d-%02d", d), Kind: "reported", Temp: 19 + float64((seq+d)%5)/2, Seq: seq}
			if seq%3 == 0 {
				u.Kind, u.Temp = "desired", 20+float64((seq+d)%4)/2
			}
			v, err := json.Marshal(u)
			if err != nil {
				return err
			}
			recs = append(recs, &kgo.Record{Key: []byte(u.Device), Value: v})
		}
	}
	return cl.ProduceSync(ctx, recs...).FirstErr()
}
