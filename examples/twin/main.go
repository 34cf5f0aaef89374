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
	if o.brokers != "" || o.redis != "" { // shared services: names of the run's own
		prefix := fmt.Sprintf("twin-%08x-", uint32(time.Now().UnixNano()))
		n = namesWith(prefix, prefix+"twins")
	}
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
		if err := createTopics(ctx, brokers, n); err != nil {
			return err
		}
		out.say("Kafka: %s (topics %s, %s, %s)", o.brokers, n.updates, n.dlq, n.commands)
	}
	if o.redis != "" {
		rt, err := openRedis(ctx, o.redis, o.redisLossy, n)
		if err != nil {
			return err
		}
		defer rt.c.Close()
		out.say("store: Redis at %s (keys twin:%s:*, commands:%s:*)", o.redis, rt.tag, rt.tag)
		return redisStory(ctx, out, o, brokers, n, rt)
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

// story is the demo on SQL: twins holds the twins, their fences and their outbox; gw
// the gateway's applied commands and inbox (its own SQLite file, or the same schema).
func story[Tx any](ctx context.Context, out *syncWriter, o options, brokers []string, n names, twins, gwStore *store[Tx]) error {
	gw, err := startGateway(ctx, o, brokers, n, gwStore)
	if err != nil {
		return err
	}
	defer gw.stop()

	start := func(name string, sink fence.Sink[Tx], extra ...kgo.Opt) (*member, error) {
		return startTwinMember(ctx, out, o, name, brokers, n, twins, sink, extra...)
	}
	refused, stop, err := takeover(ctx, out, brokers, n, twins.fast, start, func(v int) func() bool { return twinsAt(twins.db, v) })
	defer stop()
	if err != nil {
		return err
	}

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
	return verdict(ctx, out, twins.db, gw.db, refused())
}

// takeover is the story's zombie, on any store: member A folds the first updates alone; its
// next write is held at a gate while its Kafka connections freeze; member B takes over after
// A's session expired and folds every update; then A wakes and writes its held batch, which
// must be refused as stale. start starts a member writing through sink; at(n) reports whether
// every twin folded n updates. refused counts A's writes refused as stale (A may also have had
// fetched batches of other partitions in hand: refused alike); stop stops the members.
func takeover[Tx any](ctx context.Context, out *syncWriter, brokers []string, n names, sink fence.Sink[Tx],
	start func(name string, sink fence.Sink[Tx], extra ...kgo.Opt) (*member, error), at func(int) func() bool,
) (refused func() int, stop func(), err error) {
	// Member A runs behind a gate (to hold one write) and a freezer (to stop its network).
	gate, freeze := newGate[Tx](sink), newFreezer()
	refused = func() int { return int(gate.refused.Load()) }
	var a, b *member
	stop = func() {
		out.setQuiet(true) // the members' shutdown rebalances are not part of the story
		if b != nil {
			b.stop()
		}
		gate.open() // a member stops after its in-flight batch
		freeze.thaw()
		if a != nil {
			a.stop()
		}
	}
	if a, err = start("A", gate, kgo.Dialer(freeze.dial)); err != nil {
		return refused, stop, err
	}
	if err := produceUpdates(ctx, brokers, n.updates, 1, 6); err != nil {
		return refused, stop, err
	}
	if err := waitFor(ctx, at(6)); err != nil {
		return refused, stop, fmt.Errorf("waiting for A to apply the first updates: %w", err)
	}
	out.say("member A folded updates 1-6 of every device")

	gate.arm()
	if err := produceUpdates(ctx, brokers, n.updates, 7, 7); err != nil {
		return refused, stop, err
	}
	select {
	case <-gate.held:
	case <-ctx.Done():
		return refused, stop, ctx.Err()
	case <-time.After(30 * time.Second):
		return refused, stop, errors.New("member A never reached its next write")
	}
	freeze.freeze()
	out.say("member A is about to write a batch of %s and freezes (no heartbeats, no fetches), like a GC pause or a stopped VM", gate.heldKey())

	if b, err = start("B", sink); err != nil {
		return refused, stop, err
	}
	if err := produceUpdates(ctx, brokers, n.updates, 8, perDevice); err != nil {
		return refused, stop, err
	}
	if err := waitFor(ctx, at(perDevice)); err != nil {
		return refused, stop, fmt.Errorf("waiting for B to take over: %w", err)
	}
	out.say("member B took over after A's session expired and folded every update, A's held batch included")

	out.say("member A wakes up, still believing it owns %s, and writes its held batch", gate.heldKey())
	if err := gate.release(); errors.Is(err, fence.ErrStale) {
		out.say("zombie write refused: stale token (%v)", err)
	} else {
		return refused, stop, fmt.Errorf("the zombie's write returned %v, want a stale refusal", err)
	}
	freeze.thaw()
	return refused, stop, nil
}

// announce tells the story of each claim a member's partitions get.
func announce[Tx any](out *syncWriter, name string, f consumer.Factory[Tx]) consumer.Factory[Tx] {
	return func(ctx context.Context, k fence.Key, t fence.Token) (consumer.Handler[Tx], error) {
		out.say("member %s owns %s/%d with token %s", name, k.Topic, k.Partition, t)
		return f(ctx, k, t)
	}
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
	factory := func(context.Context, fence.Key, fence.Token) (consumer.Handler[Tx], error) {
		return fold(st, n.commands), nil
	}
	m, err := startMember(ctx, o, n.twins, n.updates, brokers, sink, announce(out, name, factory), extra,
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
