package status_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/shard"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/internal/operator/status"
)

// liteSharded is a sharded sink over three SQLite files (a, b, c; a is home) with placement
// version 2 in force: the rule over a, b, c and one key, moved, retired on its rule's shard
// and placed elsewhere. Every partition 0..5 of topic t is claimed by the router, and one
// fence that no move retired stands on a shard the placement does not put its key on.
type liteSharded struct {
	paths   map[string]string
	stores  map[string]*sqlitefence.Store
	p       shard.Placement
	moved   fence.Key
	from    string // the moved key's old shard
	stray   fence.Key
	strayAt string
}

func newLiteSharded(t *testing.T) *liteSharded {
	t.Helper()
	ctx := context.Background()
	e := &liteSharded{paths: map[string]string{}, stores: map[string]*sqlitefence.Store{}}
	names := []string{"a", "b", "c"}
	shards := map[string]shard.Shard[*sql.Tx]{}
	for _, n := range names {
		e.paths[n] = filepath.Join(t.TempDir(), n+".db")
		s, err := sqlitefence.Open(e.paths[n])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		e.stores[n], shards[n] = s, s
	}
	pl := shard.SQLite(e.stores["a"].DB())
	if err := pl.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pl.Publish(ctx, shard.Placement{Version: 1, Shards: names}, "three shards"); err != nil {
		t.Fatal(err)
	}
	r, err := shard.New(ctx, "a", shards, pl)
	if err != nil {
		t.Fatal(err)
	}
	for p := range int32(6) {
		k := fence.Key{Group: "g", Topic: "t", Partition: p}
		if _, err := r.Claim(ctx, k, fence.Token{Epoch: 1}, "member-1"); err != nil {
			t.Fatal(err)
		}
		if e.moved == (fence.Key{}) && r.Placement().Shard(k) == "a" {
			e.moved = k
		}
	}
	e.from = "a"
	if err := r.Move(ctx, e.moved, "c", nil); err != nil {
		t.Fatal(err)
	}
	e.p = r.Placement()
	// A fence claimed on a shard its key is not placed on, around the router.
	for p := range int32(6) {
		k := fence.Key{Group: "g", Topic: "t", Partition: p}
		if k != e.moved && e.p.Shard(k) == "b" {
			e.stray, e.strayAt = k, "c"
			break
		}
	}
	if _, err := e.stores[e.strayAt].Claim(ctx, e.stray, fence.Token{Epoch: 9}, "stray"); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *liteSharded) shards(replace map[string]string) []status.ShardAddr {
	var out []status.ShardAddr
	for _, n := range []string{"a", "b", "c"} {
		p := e.paths[n]
		if r, ok := replace[n]; ok {
			p = r
		}
		out = append(out, status.ShardAddr{Name: n, Store: p})
	}
	return out
}

// TestCollectAcrossShards: each partition is shown once, from the shard the placement puts it
// on; the moved key's retired fence and a stray fence on another shard are listed beside it,
// never as its token; the text and the page have a shard column.
func TestCollectAcrossShards(t *testing.T) {
	e := newLiteSharded(t)
	c, err := status.NewCollector(status.Config{Brokers: []string{"127.0.0.1:1"}, Shards: e.shards(nil), Group: "g", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	snap, err := c.Collect(context.Background())
	if !errors.Is(err, status.ErrUnreachable) || strings.Contains(err.Error(), "shard") {
		t.Errorf("Collect: err = %v, want only Kafka unreachable", err)
	}
	if len(snap.Partitions) != 6 || snap.Placement != 2 || len(snap.Sources) != 4 {
		t.Fatalf("snapshot: %d partitions, placement %d, sources %+v; want 6, 2, kafka and three shards", len(snap.Partitions), snap.Placement, snap.Sources)
	}
	for _, l := range snap.Partitions {
		k := fence.Key{Group: "g", Topic: l.Topic, Partition: l.Partition}
		if l.Shard != e.p.Shard(k) {
			t.Errorf("%s: shard %q, want %q", k, l.Shard, e.p.Shard(k))
		}
		switch k {
		case e.moved:
			if l.Token == "" || len(l.Elsewhere) != 1 || !l.Elsewhere[0].Retired || l.Elsewhere[0].Shard != e.from {
				t.Errorf("moved %s: token %q, elsewhere %+v; want the fence the move seeded on c and the retired one on a", k, l.Token, l.Elsewhere)
			}
		case e.stray:
			if l.Token != "0.1" || len(l.Elsewhere) != 1 || l.Elsewhere[0].Retired || l.Elsewhere[0].Token != "0.9" {
				t.Errorf("%s: token %q, elsewhere %+v; want its own 0.1 and the stray 0.9 on c, not retired", k, l.Token, l.Elsewhere)
			}
		default:
			if l.Token != "0.1" || len(l.Elsewhere) != 0 {
				t.Errorf("%s: token %q, elsewhere %+v; want 0.1 only", k, l.Token, l.Elsewhere)
			}
		}
	}
	var buf bytes.Buffer
	if err := status.WriteText(&buf, snap); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"SHARD", "moved t/" + itoa(e.moved.Partition) + ": retired on shard a", "NOT RETIRED t/" + itoa(e.stray.Partition) + ": a fence on shard c", "placement version 2"} {
		if !strings.Contains(buf.String(), w) {
			t.Errorf("text lacks %q:\n%s", w, buf.String())
		}
	}

	page, err := status.NewPage(c)
	if err != nil {
		t.Fatal(err)
	}
	page.Poll(context.Background())
	rec := httptest.NewRecorder()
	page.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if b := rec.Body.String(); !strings.Contains(b, `<th class="l">shard</th>`) || !strings.Contains(b, "retired on a") {
		t.Errorf("page lacks the shard column or the moved key's retired fence:\n%s", b)
	}

	if _, err := c.Recover(context.Background(), status.RecoverRequest{Topic: "t", Reason: "r", Force: true}); !errors.Is(err, status.ErrUsage) {
		t.Errorf("Recover across shards: err = %v, want ErrUsage", err)
	}
}

// TestCollectHomeShardDown: without the placement (its home shard unreadable), each partition
// is still shown once, from the shard holding its fence that is not retired, and the home
// shard is named unreachable.
func TestCollectHomeShardDown(t *testing.T) {
	e := newLiteSharded(t)
	missing := filepath.Join(t.TempDir(), "gone.db")
	c, err := status.NewCollector(status.Config{Brokers: []string{"127.0.0.1:1"}, Shards: e.shards(map[string]string{"a": missing}), Group: "g", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	snap, err := c.Collect(context.Background())
	if !errors.Is(err, status.ErrUnreachable) || !strings.Contains(err.Error(), "shard a: SQLite file "+missing) {
		t.Errorf("Collect: err = %v, want shard a named unreachable", err)
	}
	if snap.Placement != 0 || snap.Sources[1].Err == "" || snap.Sources[2].Err != "" || snap.Sources[3].Err != "" {
		t.Errorf("placement %d, sources %+v; want no placement and only shard a failed", snap.Placement, snap.Sources)
	}
	seen := map[int32]bool{}
	for _, l := range snap.Partitions {
		if seen[l.Partition] {
			t.Errorf("partition %d shown twice", l.Partition)
		}
		seen[l.Partition] = true
		k := fence.Key{Group: "g", Topic: "t", Partition: l.Partition}
		switch want := e.p.Shard(k); {
		case want == "a" || k == e.moved:
			// Its fence is on the unreadable shard, or the move's on c (its token is the seed's).
		case k == e.stray:
			// Two live fences: either may stand for it, the other is listed beside it.
			if len(l.Elsewhere) != 1 || l.Elsewhere[0].Retired {
				t.Errorf("%s: elsewhere %+v, want the other live fence", k, l.Elsewhere)
			}
		case l.Shard != want || l.Token != "0.1":
			t.Errorf("%s: shard %q token %q, want %q 0.1", k, l.Shard, l.Token, want)
		}
	}
}

func itoa(p int32) string { return string(rune('0' + p)) }
