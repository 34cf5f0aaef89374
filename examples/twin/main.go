package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/outbox"
)

const (
	devices      = 8
	perDevice    = 12 // updates per device; every third one is a desired-state change
	desiredTotal = devices * (perDevice / 3)
)

// names are the topics and groups of one run. The embedded run and a member use the plain
// names; a run on real services prefixes them, so that runs never share a topic or a group.
type names struct {
	updates, dlq, commands string // topics
	twins, gateway         string // groups
}

func namesWith(prefix, group string) names {
	return names{
		updates: prefix + "device-updates", dlq: prefix + "device-updates.dlq", commands: prefix + "device-commands",
		twins: group, gateway: prefix + "gateway",
	}
}

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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout)
	switch {
	case errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errUsage):
		fmt.Fprintln(os.Stderr, "twin:", err)
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "twin:", err)
		os.Exit(1)
	}
}

// run parses the command line and runs one of the three modes: the demo (default), a member
// (-serve) or the migration (-migrate).
func run(ctx context.Context, args []string, w io.Writer) error {
	o, err := parseFlags(args, w)
	if err != nil {
		return err
	}
	switch {
	case o.serve != "":
		return serve(ctx, o, w)
	case o.migrate:
		return migrate(ctx, o, w)
	}
	return demo(ctx, o, w)
}

// demo runs the story: two members and a gateway, a frozen member, a re-published command,
// and the verdict from the databases.
func demo(ctx context.Context, o options, w io.Writer) error {
	out := &syncWriter{w: w}
	n := namesWith("", "twins")
	var brokers []string
	if o.brokers == "" {
		kafka, err := kfake.NewCluster(kfake.NumBrokers(1),
			kfake.SeedTopics(4, n.updates, n.dlq), kfake.SeedTopics(2, n.commands),
			kfake.BrokerConfigs(map[string]string{"group.min.session.timeout.ms": "500"}))
		if err != nil {
			return err
		}
		defer kafka.Close()
		brokers = kafka.ListenAddrs()
		out.say("Kafka: embedded (kfake)")
	} else {
		brokers = strings.Split(o.brokers, ",")
		prefix := fmt.Sprintf("twin-%08x-", uint32(time.Now().UnixNano()))
		n = namesWith(prefix, prefix+"twins")
		if err := createTopics(ctx, brokers, n); err != nil {
			return err
		}
		out.say("Kafka: %s (topics %s, %s, %s)", o.brokers, n.updates, n.dlq, n.commands)
	}
	if o.pgURL == "" {
		dir, err := os.MkdirTemp("", "baton-twin-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		twins, gw, err := openSQLite(ctx, dir)
		if err != nil {
			return err
		}
		defer twins.close()
		defer gw.close()
		out.say("store: SQLite in %s", dir)
		return story(ctx, out, o, brokers, n, twins, gw)
	}
	twins, schema, err := openPostgres(ctx, o.pgURL, true)
	if err != nil {
		return err
	}
	defer twins.close()
	out.say("store: PostgreSQL, schema %s", schema)
	return story(ctx, out, o, brokers, n, twins, twins)
}

// story is the demo on any store: twins holds the twins, their fences and their outbox; gw
// the gateway's applied commands and inbox (its own SQLite file, or the same schema).
func story[Tx any](ctx context.Context, out *syncWriter, o options, brokers []string, n names, twins, gwStore *store[Tx]) error {
	gw, err := startGateway(ctx, o, brokers, n, gwStore)
	if err != nil {
		return err
	}
	defer gw.stop()

	// Member A runs behind a gate (to hold one write) and a freezer (to stop its network).
	gate, freeze := newGate[Tx](twins.fast), newFreezer()
	a, err := startTwinMember(ctx, out, o, "A", brokers, n, twins, gate, kgo.Dialer(freeze.dial))
	if err != nil {
		return err
	}
	defer func() { gate.open(); freeze.thaw(); a.stop() }() // a member stops after its in-flight batch
	if err := produceUpdates(ctx, brokers, n.updates, 1, 6); err != nil {
		return err
	}
	if err := waitFor(ctx, twinsAt(twins.db, 6)); err != nil {
		return fmt.Errorf("waiting for A to apply the first updates: %w", err)
	}
	out.say("member A folded updates 1-6 of every device")

	gate.arm()
	if err := produceUpdates(ctx, brokers, n.updates, 7, 7); err != nil {
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

	b, err := startTwinMember(ctx, out, o, "B", brokers, n, twins, twins.fast)
	if err != nil {
		return err
	}
	defer b.stop()
	defer out.setQuiet(true) // first of the deferred calls
	if err := produceUpdates(ctx, brokers, n.updates, 8, perDevice); err != nil {
		return err
	}
	if err := waitFor(ctx, twinsAt(twins.db, perDevice)); err != nil {
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
	if err := republishOne(ctx, out, brokers, n, gw); err != nil {
		return err
	}

	out.say("")
	if err := printTwins(ctx, out, twins.db); err != nil {
		return err
	}
	// A may also have fetched batches of other partitions before it froze: refused alike.
	return verdict(ctx, out, twins.db, gw.db, int(gate.refused.Load()))
}

// startTwinMember starts a member of the twins group writing through sink. After each
// committed batch (and every second while idle) the partition's own goroutine relays the
// partition's outbox under its token, so only the current owner publishes and marks its rows.
func startTwinMember[Tx any](ctx context.Context, out *syncWriter, o options, name string, brokers []string, n names,
	st *store[Tx], sink fence.Sink[Tx], extra ...kgo.Opt) (*member, error) {
	producer, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, extra...)...)
	if err != nil {
		return nil, err
	}
	relay, err := outbox.NewRelay(producer, st.outbox)
	if err != nil {
		producer.Close()
		return nil, err
	}
	factory := func(_ context.Context, k fence.Key, t fence.Token) (consumer.Handler[Tx], error) {
		out.say("member %s owns %s/%d with token %s", name, k.Topic, k.Partition, t)
		return fold(st, n.commands), nil
	}
	m, err := startMember(ctx, o, n.twins, n.updates, brokers, sink, factory, extra,
		consumer.AfterCommit(relay.AfterCommit(), time.Second)) // poison records go to n.dlq, the default
	if err != nil {
		producer.Close()
		return nil, err
	}
	m.onStop = producer.Close
	return m, nil
}

// fold is the twins' handler: it folds a batch into the twins table and appends a command for
// every desired-state change to the outbox, in the fenced transaction. It writes through the
// fast path: one twin row per update, merged per device (mergeTwin) and upserted set-based,
// one statement per batch, where a statement per update would fold the same (main_test.go
// compares the two).
func fold[Tx any](st *store[Tx], commands string) consumer.Handler[Tx] {
	return consumer.Handler[Tx](func(ctx context.Context, tx Tx, b *consumer.Batch) error {
		rows := make([][]any, 0, len(b.Records))
		var cmds []outbox.Message
		for _, r := range b.Records {
			var u update
			if err := json.Unmarshal(r.Value, &u); err != nil {
				return b.Fail(r, err) // a poison record goes to the dead-letter topic
			}
			rows = append(rows, twinRow(u))
			if u.Kind == "desired" {
				v, err := json.Marshal(command{Device: u.Device, SetTemp: u.Temp})
				if err != nil {
					return err
				}
				cmds = append(cmds, outbox.Message{Topic: commands, Key: r.Key, Value: v})
			}
		}
		if err := st.upsert(ctx, tx, rows); err != nil {
			return err
		}
		return st.append(ctx, tx, b.Key, b.Token, cmds...) // checks the fence too
	})
}

// produceUpdates sends updates from..to of every device, keyed by device id.
func produceUpdates(ctx context.Context, brokers []string, topic string, from, to int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
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
