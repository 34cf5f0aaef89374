package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/fence/shard"
	"github.com/batonhq/baton/internal/operator/audit"
	"github.com/batonhq/baton/internal/operator/status"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// shardEnv is a sharded sink over three PostgreSQL schemas (a, b, c: one on each cluster of
// $BATON_POSTGRES_SHARD_URLS when it is set, else all on $BATON_POSTGRES_URL's server), with
// placement version 2 in force: the rule over a, b, c, and one key moved by Retire and Publish.
// Every partition of the topic (4) is claimed; the moved one left a retired fence behind.
type shardEnv struct {
	urls      map[string]string // shard name → URL with the schema as search_path
	list      string            // -shards: a=URL,b=URL,c=URL
	placement shard.Placement
	brokers   string
	topic     string
	group     string
	moved     fence.Key
	from, to  string // the moved key's shards
}

var shardNames = []string{"a", "b", "c"}

// partitions of the test's topic: the rule puts two on each shard.
const partitions int32 = 6

func newShardEnv(t *testing.T) *shardEnv { return newShardEnvMove(t, "a", "b", false) }

// newShardEnvMove is newShardEnv with the moved key taken from shard from to shard to. With
// applied, the key applies positions 0..4 before its move (Move's copy brings its fence on to
// to 4) and 5..9 there after it.
func newShardEnvMove(t *testing.T, from, to string, applied bool) *shardEnv {
	t.Helper()
	var bases []string
	if v := os.Getenv(envShards); v != "" {
		bases = strings.Split(v, ",")
	}
	t.Setenv(envShards, "") // the commands are given -shards
	for len(bases) < len(shardNames) {
		bases = append(bases, testenv.PostgresURL(t))
	}
	e := &shardEnv{urls: map[string]string{}, group: testenv.UniqueName("g")}
	var list []string
	for i, n := range shardNames {
		e.urls[n] = schemaURL(t, bases[i])
		list = append(list, n+"="+e.urls[n])
	}
	e.list = strings.Join(list, ",")

	// The tables of every shard and the placement table of the home shard, by the command.
	out, code := runCmd(t, "migrate", "-shards", e.list)
	if code != 0 || strings.Count(out, "migrated shard ") != 3 || !strings.Contains(out, "_cursors, baton_placements exist") {
		t.Fatalf("migrate across shards: exit %d:\n%s", code, out)
	}

	ctx := testenv.Context(t, 30*time.Second)
	pools := map[string]*pgxpool.Pool{}
	shards := map[string]shard.Shard[pgx.Tx]{}
	for _, n := range shardNames {
		pool, err := pgxpool.New(ctx, e.urls[n])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		s, err := pgfence.New(pool)
		if err != nil {
			t.Fatal(err)
		}
		pools[n], shards[n] = pool, s
	}
	pl := shard.Postgres(pools["a"])
	if err := pl.Publish(ctx, shard.Placement{Version: 1, Shards: shardNames}, "three shards"); err != nil {
		t.Fatal(err)
	}
	r, err := shard.New(ctx, "a", shards, pl)
	if err != nil {
		t.Fatal(err)
	}
	brokers := testenv.FakeKafka(t)
	e.brokers = strings.Join(brokers, ",")
	e.topic = testenv.NewTopic(t, brokers, partitions)
	for p := range partitions {
		k := fence.Key{Group: e.group, Topic: e.topic, Partition: p}
		if _, err := r.Claim(ctx, k, fence.Token{Epoch: 1}, "member-1"); err != nil {
			t.Fatal(err)
		}
		if e.moved == (fence.Key{}) && r.Placement().Shard(k) == from {
			e.moved = k
		}
	}
	if e.moved == (fence.Key{}) {
		t.Fatalf("no partition of the topic is placed on shard %s", from)
	}
	e.from, e.to = from, to
	tok := fence.Token{Epoch: 1}
	noop := func(context.Context, pgx.Tx) error { return nil }
	if applied {
		must(t, r.Apply(ctx, e.moved, tok, 0, 4, noop))
	}
	must(t, r.Move(ctx, e.moved, to, nil))
	if applied {
		st, err := r.Load(ctx, e.moved)
		must(t, err)
		next := fence.Token{Era: st.Token.Era, Epoch: 1}
		_, err = r.Claim(ctx, e.moved, next, "member-1")
		must(t, err)
		must(t, r.Apply(ctx, e.moved, next, 5, 9, noop))
	}
	e.placement = r.Placement()
	return e
}

// schemaURL makes a fresh schema on the cluster at base and returns base with the schema as
// its search_path; the schema is dropped when t ends.
func schemaURL(t *testing.T, base string) string {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	schema := testenv.UniqueName("shardops")
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = admin.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		_ = admin.Close(ctx)
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// runCmd runs the baton command line and returns its stdout and stderr, and its exit status.
func runCmd(t *testing.T, args ...string) (string, int) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(args, &stdout, &stderr)
	return stdout.String() + stderr.String(), code
}

// TestOperateAcrossShards: every operator command reads every shard of the placement. status
// shows each partition once, from the shard the placement puts it on, and the moved key's
// retired fence as moved, not as an owner; who-owns names the key's shard; eras lists each
// shard's recoveries; audit judges each shard and not the retired fence; schema prints the
// placement table for the home shard.
func TestOperateAcrossShards(t *testing.T) {
	e := newShardEnv(t)
	src := []string{"-shards", e.list, "-brokers", e.brokers, "-group", e.group, "-timeout", "10s"}

	out, code := runCmd(t, append([]string{"status", "-json"}, src...)...)
	if code != 0 {
		t.Fatalf("status: exit %d:\n%s", code, out)
	}
	var snap status.Snapshot
	if err := json.Unmarshal([]byte(out), &snap); err != nil {
		t.Fatalf("status -json: %v:\n%s", err, out)
	}
	if len(snap.Partitions) != int(partitions) || snap.Placement != 2 || strings.Join(snap.Shards, ",") != "a,b,c" {
		t.Fatalf("status: %d partitions, placement %d, shards %v; want %d, 2, [a b c]:\n%s", len(snap.Partitions), snap.Placement, snap.Shards, partitions, out)
	}
	on := map[string]int{}     // partitions placed per shard
	fences := map[string]int{} // live fences per shard: the moved key's is on b, seeded by the move
	for _, p := range snap.Partitions {
		k := fence.Key{Group: e.group, Topic: p.Topic, Partition: p.Partition}
		on[p.Shard]++
		fences[p.Shard]++
		if want := e.placement.Shard(k); p.Shard != want {
			t.Errorf("%s: shard %q, want the placement's %q", k, p.Shard, want)
		}
		if p.Retired {
			t.Errorf("%s: shown retired, but the placement puts it on a shard where it is live", k)
		}
		if k == e.moved {
			if len(p.Elsewhere) != 1 || p.Elsewhere[0].Shard != e.from || !p.Elsewhere[0].Retired {
				t.Errorf("moved %s: elsewhere %+v, want its retired fence on %s", k, p.Elsewhere, e.from)
			}
			if strings.Contains(p.Token, fmt.Sprint(int64(^uint64(0)>>1))) {
				t.Errorf("moved %s: its line shows the retired token %s", k, p.Token)
			}
			continue
		}
		if p.Token == "" || len(p.Elsewhere) != 0 {
			t.Errorf("%s: token %q, elsewhere %+v; want its fence on %s and nothing elsewhere", k, p.Token, p.Elsewhere, p.Shard)
		}
	}
	if on["a"] == 0 || on["b"] == 0 || on["c"] == 0 {
		t.Errorf("partitions per shard %v: want each shard to hold one", on)
	}

	out, code = runCmd(t, append([]string{"status"}, src...)...)
	if code != 0 || !strings.Contains(out, "SHARD") || !strings.Contains(out, fmt.Sprintf("moved %s/%d: retired on shard a", e.topic, e.moved.Partition)) ||
		!strings.Contains(out, "placement version 2") {
		t.Errorf("status text: exit %d, want a SHARD column, the moved key and the placement version:\n%s", code, out)
	}

	key := ""
	for i := 0; key == ""; i++ {
		if p, err := status.Route("murmur2", e.topic, fmt.Appendf(nil, "k%d", i), int(partitions)); err == nil && p == e.moved.Partition {
			key = fmt.Sprintf("k%d", i)
		}
	}
	out, code = runCmd(t, append([]string{"who-owns", "-topic", e.topic}, append(src, key)...)...)
	if code != 0 || !strings.Contains(out, "shard b (placement version 2) holds") || !strings.Contains(out, "also a fence on shard a") {
		t.Errorf("who-owns %s: exit %d, want shard b and the retired fence on a:\n%s", key, code, out)
	}

	out, code = runCmd(t, "eras", "-shards", e.list, "-group", e.group)
	if code != 0 || !strings.Contains(out, "SHARD") || !strings.Contains(out, "retire on a") {
		t.Errorf("eras: exit %d, want the retirement recorded on shard a:\n%s", code, out)
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "retire on a") && !strings.Contains(l, " a  ") {
			t.Errorf("eras: the retirement is not shown on shard a: %q", l)
		}
	}

	out, code = runCmd(t, append([]string{"audit", "-once", "-json"}, src...)...)
	var rep audit.Report
	if err := json.Unmarshal([]byte(out[:strings.LastIndex(out, "}")+1]), &rep); err != nil {
		t.Fatalf("audit -json: exit %d, %v:\n%s", code, err, out)
	}
	if code != 0 || len(rep.Violations) != 0 || rep.Partitions != int(partitions) || len(rep.Shards) != 3 {
		t.Fatalf("audit: exit %d, %d violations, %d partitions, %d shards; want 0, 0, %d, 3:\n%s", code, len(rep.Violations), rep.Partitions, len(rep.Shards), partitions, out)
	}
	for _, s := range rep.Shards {
		retired := 0
		if s.Name == e.from {
			retired = 1
		}
		if s.Retired != retired || s.Partitions != fences[s.Name] {
			t.Errorf("audit of shard %s: %d partitions, %d retired; want %d, %d", s.Name, s.Partitions, s.Retired, fences[s.Name], retired)
		}
	}

	out, code = runCmd(t, "schema", "-shards", e.list)
	if code != 0 || !strings.Contains(out, "each shard's database (a, b, c)") || !strings.Contains(out, "Home shard a only") ||
		!strings.Contains(out, "CREATE TABLE IF NOT EXISTS baton_placements") || !strings.Contains(out, `GRANT SELECT ON TABLE "baton_placements" TO "baton_runtime"`) {
		t.Errorf("schema -shards: exit %d:\n%s", code, out)
	}
}

// TestOperateAcrossShardsOneDown: with one shard unreachable, each command reports the others,
// names the unreachable one, exits 1 and shows no password.
func TestOperateAcrossShardsOneDown(t *testing.T) {
	e := newShardEnv(t)
	const down = "postgres://baton:secretpw@127.0.0.1:1/baton"
	list := strings.Replace(e.list, "c="+e.urls["c"], "c="+down, 1)
	src := []string{"-shards", list, "-brokers", e.brokers, "-group", e.group, "-timeout", "2s"}
	live := 0 // partitions on a or b
	for p := range partitions {
		if e.placement.Shard(fence.Key{Group: e.group, Topic: e.topic, Partition: p}) != "c" {
			live++
		}
	}
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"status", append([]string{"status"}, src...), []string{"baton status: shard c: PostgreSQL at", "could not read shard c (postgres://baton:xxxxx@127.0.0.1:1/baton)", "moved " + e.topic}},
		{"who-owns", append([]string{"who-owns", "-topic", e.topic}, append(src, "k")...), []string{"unreachable: shard c"}},
		{"eras", []string{"eras", "-shards", list, "-group", e.group, "-timeout", "2s"}, []string{"shard c: PostgreSQL at postgres://baton:xxxxx@127.0.0.1:1/baton did not answer", "retire on a"}},
		{"migrate", []string{"migrate", "-shards", list, "-timeout", "2s"}, []string{"migrated shard a", "migrated shard b", "shard c: PostgreSQL at postgres://baton:xxxxx@127.0.0.1:1/baton did not answer"}},
		{"audit", append([]string{"audit", "-once"}, src...), []string{"shard c (postgres://baton:xxxxx@127.0.0.1:1/baton): not read", "baton audit: shard c: PostgreSQL at", "shard a (", "shard b ("}},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, code := runCmd(t, c.args...)
			if code != 1 {
				t.Errorf("exit %d, want 1:\n%s", code, out)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if strings.Contains(out, "secretpw") {
				t.Errorf("the password is shown:\n%s", out)
			}
			if c.name == "status" {
				if n := strings.Count(out, e.topic+" "); n < live {
					t.Errorf("status shows %d lines of the topic, want at least the %d partitions of the shards that answer:\n%s", n, live, out)
				}
			}
		})
	}
}

// TestAuditRetiredFenceNotJudged: a moved key's retired fence stands at the position where the
// key left its shard while the group's committed offset moves on with the key's new shard.
// With the placement unreadable (its home shard down), every shard judges the fences it holds:
// the retired one is still not judged (it would read as records skipped), and the key is
// judged on its new shard.
func TestAuditRetiredFenceNotJudged(t *testing.T) {
	e := newShardEnvMove(t, "b", "c", true)
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(e.brokers, ",")...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	offs := kadm.Offsets{}
	offs.Add(kadm.Offset{Topic: e.topic, Partition: e.moved.Partition, At: 10, LeaderEpoch: -1})
	if err := kadm.NewClient(cl).CommitAllOffsets(testenv.Context(t, 10*time.Second), e.group, offs); err != nil {
		t.Fatal(err)
	}
	const down = "postgres://baton:secretpw@127.0.0.1:1/baton"
	list := strings.Replace(e.list, "a="+e.urls["a"], "a="+down, 1)
	for _, shards := range []string{e.list, list} {
		out, code := runCmd(t, "audit", "-once", "-json", "-shards", shards, "-brokers", e.brokers, "-group", e.group, "-timeout", "2s")
		var rep audit.Report
		if err := json.Unmarshal([]byte(out[:strings.LastIndex(out, "}")+1]), &rep); err != nil {
			t.Fatalf("audit -json: exit %d, %v:\n%s", code, err, out)
		}
		for _, v := range rep.Violations {
			t.Errorf("violation: %s", v)
		}
		for _, s := range rep.Shards {
			if s.Name == "b" && s.Retired != 1 {
				t.Errorf("shard b: %d retired fences, want the moved key's", s.Retired)
			}
		}
		if home := shards == list; (code != 0) != home || strings.Contains(out, "secretpw") {
			t.Errorf("audit with the home shard down %v: exit %d:\n%s", home, code, out)
		}
	}
}
