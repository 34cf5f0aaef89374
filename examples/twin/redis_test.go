package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/redisfence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/outbox"
)

// The Redis tests run on the shared server of BATON_REDIS_ADDR, which deploy/local starts
// without an append-only file: they accept it explicitly (-redis-allow-loss), and each works
// under a hash tag of its own, whose keys it deletes when it ends.

func redisAddr(t *testing.T) string {
	return service(t, "BATON_REDIS_ADDR", "'make up' starts Redis")
}

// dropTagged deletes every key of the server that holds tag (the twins, the streams, the
// fences), when the test ends.
func dropTagged(t *testing.T, c *redis.Client, tag string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, k := range tagged(ctx, t, c, tag) {
			c.Del(ctx, k)
		}
	})
}

// tagged lists the keys that hold tag, sorted.
func tagged(ctx context.Context, t *testing.T, c *redis.Client, tag string) []string {
	var keys []string
	iter := c.Scan(ctx, 0, "*"+tag+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Errorf("SCAN: %v", err)
	}
	slices.Sort(keys)
	return keys
}

// dump renders the caller's keys under tag (every key but the fence store's own), with their
// contents, as text: two dumps are equal when nothing of the data changed.
func dump(ctx context.Context, t *testing.T, c *redis.Client, tag string) string {
	t.Helper()
	var b strings.Builder
	for _, k := range tagged(ctx, t, c, tag) {
		if strings.HasPrefix(k, "baton:") {
			continue
		}
		switch typ := c.Type(ctx, k).Val(); typ {
		case "hash":
			h := c.HGetAll(ctx, k).Val()
			fields := slices.Sorted(func(yield func(string) bool) {
				for f := range h {
					if !yield(f) {
						return
					}
				}
			})
			fmt.Fprintf(&b, "%s:", k)
			for _, f := range fields {
				fmt.Fprintf(&b, " %s=%s", f, h[f])
			}
			b.WriteByte('\n')
		case "stream":
			for _, m := range c.XRange(ctx, k, "-", "+").Val() {
				fmt.Fprintf(&b, "%s: %s %v\n", k, m.ID, m.Values)
			}
		default:
			fmt.Fprintf(&b, "%s: a %s\n", k, typ)
		}
	}
	return b.String()
}

// TestExampleRedis runs the demo with -redis (Kafka embedded) and checks its story and, key
// by key, what it left in Redis: each device's twin hash holds its last reported and desired
// temperatures at version 12, and its command stream holds one entry per desired-state change
// (updates 3, 6, 9 and 12), in order, with the temperature the update asked for. Without
// -redis-allow-loss the same server is refused, with the reason.
func TestExampleRedis(t *testing.T) {
	addr := redisAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() }) // after dropTagged's
	var out bytes.Buffer
	if c.ConfigGet(ctx, "appendfsync").Val()["appendfsync"] != "always" {
		err := run(ctx, []string{"-redis", addr}, &out)
		if err == nil || !strings.Contains(err.Error(), "may lose acknowledged writes") || !strings.Contains(err.Error(), "-redis-allow-loss") {
			t.Errorf("-redis on a server without appendfsync always: %v, want a refusal naming -redis-allow-loss", err)
		}
		out.Reset()
	}
	err := run(ctx, []string{"-redis", addr, "-redis-allow-loss"}, &out)
	t.Logf("output:\n%s", out.String())
	m := regexp.MustCompile(`keys twin:(\{[^}]+\}):\*`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("the output names no keys (%v)", err)
	}
	tag := m[1]
	dropTagged(t, c, tag)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"member B took over after A's session expired",
		"zombie write refused: stale token",
		"verdict: PASS: 8 twins, each at version 12 = its updates; 32 commands, each in its device's stream once, in order; zombie writes refused: ",
	} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("the output lacks %q", line)
		}
	}
	temp := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	for d := range devices {
		dev := deviceName(d)
		twin := c.HGetAll(ctx, "twin:"+tag+":"+dev).Val()
		want := map[string]string{ // produceUpdates: update 11 is the last reported, 12 the last desired
			"reported": temp(19 + float64((11+d)%5)/2), "desired": temp(20 + float64((12+d)%4)/2),
			"version": "12", "last_seq": "12",
		}
		if fmt.Sprint(twin) != fmt.Sprint(want) {
			t.Errorf("twin %s = %v, want %v", dev, twin, want)
		}
		msgs := c.XRange(ctx, "commands:"+tag+":"+dev, "-", "+").Val()
		var got []string
		for _, m := range msgs {
			got = append(got, fmt.Sprintf("%v:%v", m.Values["seq"], m.Values["set_temp"]))
			if src, _ := m.Values["source"].(string); !strings.Contains(src, "device-updates/") {
				t.Errorf("command %v of %s names no source update", m.Values, dev)
			}
		}
		var wantCmds []string
		for seq := 3; seq <= perDevice; seq += 3 {
			wantCmds = append(wantCmds, fmt.Sprintf("%d:%s", seq, temp(20+float64((seq+d)%4)/2)))
		}
		if !slices.Equal(got, wantCmds) {
			t.Errorf("commands of %s = %v, want %v", dev, got, wantCmds)
		}
	}
	for _, k := range tagged(ctx, t, c, tag) {
		if !strings.HasPrefix(k, "twin:") && !strings.HasPrefix(k, "commands:") && !strings.HasPrefix(k, "baton:") {
			t.Errorf("the run wrote %s, neither a twin, a command stream nor a fence", k)
		}
	}
}

// redisTest opens the twins' store on the shared server under names of the test's own, and
// returns the key of one of the updates topic's partitions.
func redisTest(t *testing.T, ctx context.Context) (*redisTwins, fence.Key) {
	t.Helper()
	prefix := uniqueName("twinredis") + "-"
	n := namesWith(prefix, prefix+"twins")
	rt, err := openRedis(ctx, redisAddr(t), true, n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.c.Close() })
	dropTagged(t, rt.c, rt.tag)
	return rt, fence.Key{Group: n.twins, Topic: n.updates, Partition: 1}
}

// batchOf is updates us as a batch of partition k, its records at offsets from first on.
func batchOf(t *testing.T, k fence.Key, tok fence.Token, first int64, us []update) *consumer.Batch {
	b := &consumer.Batch{Key: k, Token: tok}
	for i, u := range us {
		v, err := json.Marshal(u)
		if err != nil {
			t.Fatal(err)
		}
		b.Records = append(b.Records, &kgo.Record{Topic: k.Topic, Partition: k.Partition, Offset: first + int64(i), Key: []byte(u.Device), Value: v})
	}
	return b
}

// applyRedis applies b through the fence, as the consumer does, with foldRedis.
func applyRedis(ctx context.Context, rt *redisTwins, b *consumer.Batch) error {
	first, last := b.Records[0].Offset, b.Records[len(b.Records)-1].Offset
	return rt.store.Apply(ctx, b.Key, b.Token, first, last, func(ctx context.Context, tx *redisfence.Tx) error {
		return foldRedis(rt)(ctx, tx, b)
	})
}

// redisSnapshot is the twins on Redis in snapshot's format (device reported desired version
// last_seq, NULL for a column never written), for the devices of foldBatches.
func redisSnapshot(ctx context.Context, t *testing.T, rt *redisTwins) string {
	t.Helper()
	var s string
	for _, d := range []string{"a", "b", "c", "d", "e"} {
		h, err := rt.twinOf(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		if len(h) == 0 {
			continue
		}
		col := func(f string) string {
			v, ok := h[f]
			if !ok {
				return "NULL"
			}
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("twin %s: %s = %q", d, f, v)
			}
			return fmt.Sprint(x)
		}
		s += fmt.Sprintf("%s %s %s %s %s\n", d, col("reported"), col("desired"), h["version"], h["last_seq"])
	}
	return s
}

// TestFoldRedisMatchesSQL: the fold on Redis leaves each device's twin hash, after every
// batch of foldBatches, exactly as the fold on SQLite leaves its row, and each device's
// command stream holds the commands the SQL fold appends to the outbox, in order.
func TestFoldRedisMatchesSQL(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rt, k := redisTest(t, ctx)
	twins, gw, err := openSQLite(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer twins.close()
	defer gw.close()
	var cmds []outbox.Message
	ref := *twins
	ref.append = recordAppends[*sql.Tx](&cmds)
	refFold := fold(&ref, "cmds")
	db := twins.sink.(*sqlitefence.Store).DB()

	tok := fence.Token{Epoch: 1}
	if _, err := rt.store.Claim(ctx, k, tok, "test"); err != nil {
		t.Fatal(err)
	}
	off := int64(0)
	for i, us := range foldBatches() {
		b := batchOf(t, k, tok, off, us)
		off += int64(len(us))
		if err := applyRedis(ctx, rt, b); err != nil {
			t.Fatalf("batch %d on Redis: %v", i, err)
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := refFold(ctx, tx, b); err != nil {
			t.Fatalf("batch %d on SQLite: %v", i, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if got, want := redisSnapshot(ctx, t, rt), snapshot(ctx, t, twins); got != want {
			t.Fatalf("after batch %d the twins on Redis are\n%s\non SQLite\n%s", i, got, want)
		}
	}
	want := map[string][]string{}
	for _, m := range cmds {
		var c command
		if err := json.Unmarshal(m.Value, &c); err != nil {
			t.Fatal(err)
		}
		want[c.Device] = append(want[c.Device], fmt.Sprint(c.SetTemp))
	}
	for _, d := range []string{"a", "b", "c", "d", "e"} {
		var got []string
		for _, m := range rt.c.XRange(ctx, rt.commandsKey(d), "-", "+").Val() {
			x, _ := strconv.ParseFloat(fmt.Sprint(m.Values["set_temp"]), 64)
			got = append(got, fmt.Sprint(x))
		}
		if !slices.Equal(got, want[d]) {
			t.Errorf("device %s's stream holds commands %v, the SQL fold appended %v", d, got, want[d])
		}
	}
	if len(cmds) == 0 {
		t.Fatal("the batches made no command: the comparison shows nothing")
	}
}

// TestRedisZombieWritesNothing: a batch written under a token that a later claim outranked is
// refused as stale, and nothing of it lands: no twin field, no version, no command, no fence
// advance. The new owner's write of the same batch then lands.
func TestRedisZombieWritesNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rt, k := redisTest(t, ctx)
	old, cur := fence.Token{Epoch: 1}, fence.Token{Epoch: 2}
	if _, err := rt.store.Claim(ctx, k, old, "A"); err != nil {
		t.Fatal(err)
	}
	first := []update{{"d-01", "reported", 19, 1}, {"d-01", "desired", 21, 2}}
	if err := applyRedis(ctx, rt, batchOf(t, k, old, 0, first)); err != nil {
		t.Fatal(err)
	}
	before := dump(ctx, t, rt.c, rt.tag)
	if _, err := rt.store.Claim(ctx, k, cur, "B"); err != nil {
		t.Fatal(err)
	}
	held := []update{{"d-01", "reported", 25, 3}, {"d-01", "desired", 26, 4}, {"d-02", "desired", 22, 1}}
	err := applyRedis(ctx, rt, batchOf(t, k, old, 2, held))
	var stale *fence.StaleError
	if !errors.Is(err, fence.ErrStale) || !errors.As(err, &stale) {
		t.Fatalf("the zombie's batch = %v, want a stale refusal", err)
	}
	t.Logf("refused: %v", err)
	if after := dump(ctx, t, rt.c, rt.tag); after != before {
		t.Fatalf("the refused batch wrote:\nbefore\n%s\nafter\n%s", before, after)
	}
	if st, err := rt.store.Load(ctx, k); err != nil || st.Token != cur || st.Position != 1 {
		t.Fatalf("after the refusal the fence is %+v (%v), want B's token at position 1", st, err)
	}
	if err := applyRedis(ctx, rt, batchOf(t, k, cur, 2, held)); err != nil {
		t.Fatalf("the owner's batch: %v", err)
	}
	if v := rt.c.HGet(ctx, rt.twinKey("d-01"), "version").Val(); v != "4" {
		t.Errorf("after the owner's batch d-01 is at version %q, want 4", v)
	}
	if n := rt.c.XLen(ctx, rt.commandsKey("d-02")).Val(); n != 1 {
		t.Errorf("after the owner's batch d-02 has %d commands, want 1", n)
	}
	if before == "" || !strings.Contains(before, "reported=19") {
		t.Fatalf("the first batch wrote nothing visible: %q", before)
	}
}

// TestServeRedis runs the member program on Redis (-serve -redis) against the real broker:
// once /readyz answers 200 it is fed the devices' updates, and every twin reaches version 12
// with its four commands in its stream; it stops as SIGTERM stops it (Run returns nil).
func TestServeRedis(t *testing.T) {
	brokers, addr := kafkaBrokers(t), redisAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	prefix := uniqueName("serveredis") + "-"
	n := namesWith(prefix, prefix+"twins")
	if err := createTopics(ctx, brokers, n); err != nil {
		t.Fatal(err)
	}
	rt, err := openRedis(ctx, addr, true, n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.c.Close() })
	dropTagged(t, rt.c, rt.tag)

	pr, pw := io.Pipe()
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- run(sctx, []string{"-serve", "127.0.0.1:0", "-brokers", strings.Join(brokers, ","), "-redis", addr, "-redis-allow-loss",
			"-group", n.twins, "-prefix", prefix, "-session-timeout", "6s"}, pw)
		pw.Close()
	}()
	defer func() { stop(); <-done }()
	line, err := bufio.NewReader(pr).ReadString('\n')
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	if err != nil {
		t.Fatalf("no first line from -serve: %v (%v)", err, <-done)
	}
	m := regexp.MustCompile(`http://([^/]+)/metrics`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("-serve printed %q, want its address", line)
	}
	ready := func() (int, string) {
		resp, err := http.Get("http://" + m[1] + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if err := waitFor(ctx, func() bool { c, _ := ready(); return c == http.StatusOK }); err != nil {
		c, body := ready()
		t.Fatalf("/readyz never answered 200: last %d %q", c, body)
	}
	if err := produceUpdates(ctx, brokers, n.updates, 1, perDevice); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, rt.at(perDevice)); err != nil {
		t.Fatalf("the member did not fold every update: %v", err)
	}
	for d := range devices {
		if v := rt.c.HGet(ctx, rt.twinKey(deviceName(d)), "version").Val(); v != strconv.Itoa(perDevice) {
			t.Errorf("twin %s at version %s, want %d", deviceName(d), v, perDevice)
		}
		if k := rt.c.XLen(ctx, rt.commandsKey(deviceName(d))).Val(); k != perDevice/3 {
			t.Errorf("device %s has %d commands, want %d", deviceName(d), k, perDevice/3)
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Errorf("-serve returned %v after its context ended, want nil", err)
	}
	done <- nil
}
