package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/redisfence"
)

// The twins on Redis. Each device's twin is a hash, twin:{g/t}:<device> (reported, desired,
// version, last_seq), and each device's commands are a stream, commands:{g/t}:<device>, that
// the device (or its gateway) reads with XREAD from the last entry it handled. A batch's twin
// writes, its commands and the partition's fence advance are one script (redisfence), so a
// zombie's batch is refused whole: no twin field and no command of it is written.
//
// There is no outbox on Redis, so the commands do not go through Kafka: the stream is where
// they are delivered. A command is appended exactly once, with the batch that caused it (a
// batch applied again after a crash is refused as a duplicate); each entry carries the update's
// source (topic/partition/offset), stable across redeliveries, for a reader that must
// deduplicate after losing its own cursor. {g/t} is the (group, topic) hash tag, so on a Redis
// Cluster every key a batch writes is in the slot of its fence.

// redisTwins is the twins' store on Redis.
type redisTwins struct {
	c     *redis.Client
	store *redisfence.Store
	tag   string // redisfence.HashTag of the twins group and the updates topic
}

func (r *redisTwins) twinKey(device string) string     { return "twin:" + r.tag + ":" + device }
func (r *redisTwins) commandsKey(device string) string { return "commands:" + r.tag + ":" + device }

// openRedis connects to the server at addr and checks that it keeps what it acknowledges
// (appendonly yes, appendfsync always), unless lossy accepts one that does not.
func openRedis(ctx context.Context, addr string, lossy bool, n names) (*redisTwins, error) {
	c := redis.NewClient(&redis.Options{Addr: addr})
	var opts []redisfence.Option
	if lossy {
		opts = append(opts, redisfence.AllowLosingAcknowledgedWrites())
	}
	s, err := redisfence.New(c, opts...)
	if err == nil {
		err = s.Check(ctx)
	}
	if errors.Is(err, redisfence.ErrNotDurable) {
		err = fmt.Errorf("%w (-redis-allow-loss accepts it)", err)
	}
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("-redis %s: %w", addr, err)
	}
	return &redisTwins{c: c, store: s, tag: redisfence.HashTag(n.twins, n.updates)}, nil
}

// foldRedis is the twins' handler on Redis: a batch's updates merged per device (mergeTwin),
// each device's twin written once (HSET of the columns the batch changed, HINCRBY of the
// version), and a command appended to the device's stream for every desired-state change,
// all queued on the fenced transaction.
func foldRedis(rt *redisTwins) consumer.Handler[*redisfence.Tx] {
	return func(ctx context.Context, tx *redisfence.Tx, b *consumer.Batch) error {
		rows := map[string][]any{}
		var order []string
		for _, r := range b.Records {
			var u update
			if err := json.Unmarshal(r.Value, &u); err != nil {
				return b.Fail(r, err) // a poison record goes to the dead-letter topic
			}
			row := twinRow(u)
			if into, ok := rows[u.Device]; ok {
				mergeTwin(into, row)
			} else {
				rows[u.Device] = row
				order = append(order, u.Device)
			}
			if u.Kind == "desired" {
				tx.XAdd(rt.commandsKey(u.Device), "set_temp", ftoa(u.Temp), "seq", strconv.Itoa(u.Seq),
					"source", fmt.Sprintf("%s/%d/%d", r.Topic, r.Partition, r.Offset), "token", b.Token.String())
			}
		}
		for _, d := range order {
			row := rows[d]
			fields := []string{"last_seq", strconv.FormatInt(row[4].(int64), 10)}
			if row[1] != nil {
				fields = append(fields, "reported", ftoa(row[1].(float64)))
			}
			if row[2] != nil {
				fields = append(fields, "desired", ftoa(row[2].(float64)))
			}
			tx.HSet(rt.twinKey(d), fields...)
			tx.HIncrBy(rt.twinKey(d), "version", row[3].(int64))
		}
		return nil
	}
}

func ftoa(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// redisStory is the demo on Redis: the same members, freeze and takeover as on SQL, with the
// commands in the devices' streams instead of the outbox, the relay and the gateway.
func redisStory(ctx context.Context, out *syncWriter, o options, brokers []string, n names, rt *redisTwins) error {
	fold := func(context.Context, fence.Key, fence.Token) (consumer.Handler[*redisfence.Tx], error) {
		return foldRedis(rt), nil
	}
	start := func(name string, sink fence.Sink[*redisfence.Tx], extra ...kgo.Opt) (*member, error) {
		return startMember(ctx, o, n.twins, n.updates, brokers, sink, announce(out, name, fold), extra)
	}
	refused, stop, err := takeover(ctx, out, brokers, n, fence.Sink[*redisfence.Tx](rt.store), start, rt.at)
	defer stop()
	if err != nil {
		return err
	}
	out.say("")
	if err := rt.print(ctx, out); err != nil {
		return err
	}
	return rt.verdict(ctx, out, refused())
}

// twinOf is a device's twin as Redis holds it ("" for a field not written).
func (r *redisTwins) twinOf(ctx context.Context, device string) (map[string]string, error) {
	return r.c.HGetAll(ctx, r.twinKey(device)).Result()
}

// at reports whether every device's twin has folded n updates.
func (r *redisTwins) at(n int) func() bool {
	return func() bool {
		for d := range devices {
			v, err := r.c.HGet(context.Background(), r.twinKey(deviceName(d)), "version").Int()
			if err != nil || v < n {
				return false
			}
		}
		return true
	}
}

func deviceName(d int) string { return fmt.Sprintf("d-%02d", d) }

// print prints the twins as printTwins does.
func (r *redisTwins) print(ctx context.Context, out *syncWriter) error {
	out.say("device  reported  desired  version")
	for d := range devices {
		t, err := r.twinOf(ctx, deviceName(d))
		if err != nil {
			return err
		}
		rep, _ := strconv.ParseFloat(t["reported"], 64)
		des, _ := strconv.ParseFloat(t["desired"], 64)
		v, _ := strconv.ParseInt(t["version"], 10, 64)
		out.say("%-7s %8.1f %8.1f %8d", deviceName(d), rep, des, v)
	}
	return nil
}

// verdict checks the invariants on Redis and prints one line: every twin's version equals its
// number of updates, each device's stream holds its desired-state changes once each, in order,
// and the zombie was refused.
func (r *redisTwins) verdict(ctx context.Context, out *syncWriter, refused int) error {
	var bad []string
	commands := 0
	for d := range devices {
		dev := deviceName(d)
		t, err := r.twinOf(ctx, dev)
		if err != nil {
			return err
		}
		if t["version"] != strconv.Itoa(perDevice) || t["last_seq"] != t["version"] {
			bad = append(bad, fmt.Sprintf("twin %s at version %q, last update %q; want %d", dev, t["version"], t["last_seq"], perDevice))
		}
		msgs, err := r.c.XRange(ctx, r.commandsKey(dev), "-", "+").Result()
		if err != nil {
			return err
		}
		var got, want []string
		for _, m := range msgs {
			got = append(got, fmt.Sprint(m.Values["seq"]))
		}
		for seq := 3; seq <= perDevice; seq += 3 {
			want = append(want, strconv.Itoa(seq))
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			bad = append(bad, fmt.Sprintf("device %s's commands are of updates %v, want %v", dev, got, want))
		}
		commands += len(msgs)
	}
	if refused < 1 {
		bad = append(bad, "no zombie write was refused: the fault did not bite")
	}
	if len(bad) > 0 {
		out.say("verdict: FAIL: %s", strings.Join(bad, "; "))
		return errors.New("invariants violated")
	}
	out.say("verdict: PASS: %d twins, each at version %d = its updates; %d commands, each in its device's stream once, in order; zombie writes refused: %d",
		devices, perDevice, commands, refused)
	return nil
}
