package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/fence/shard"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/pgoutbox"
)

func TestParseKey(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want fence.Key
		ok   bool
	}{
		{"g/t/3", fence.Key{Group: "g", Topic: "t", Partition: 3}, true},
		{"team/devices/telemetry/0", fence.Key{Group: "team/devices", Topic: "telemetry", Partition: 0}, true},
		{"g/t", fence.Key{}, false},
		{"g/t/-1", fence.Key{}, false},
		{"g//1", fence.Key{}, false},
		{"/t/1", fence.Key{}, false},
		{"g/t/x", fence.Key{}, false},
	} {
		got, err := parseKey(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseKey(%q) = %+v, %v; want %+v, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

// TestPlacementShowAndMove: three shards (schemas on $BATON_POSTGRES_URL) named in
// $BATON_POSTGRES_SHARD_URLS; a partition on a has applied records and appended outbox rows,
// some delivered. 'baton placement move' moves it to b: the fence on b stands at a's position
// above a's retired token, b holds the undelivered rows and the cursor; 'placement show' shows
// version 2, the entry and the move's reason.
func TestPlacementShowAndMove(t *testing.T) {
	base := testenv.PostgresURL(t)
	ctx := t.Context()
	names := []string{"a", "b", "c"}
	var entries []string
	stores := map[string]*pgfence.Store{}
	pools := map[string]*pgxpool.Pool{}
	boxes := map[string]*pgoutbox.Store{}
	shards := map[string]shard.Shard[pgx.Tx]{}
	for _, n := range names {
		pool, schema := testenv.Postgres(t)
		st, err := pgfence.New(pool)
		must(t, err)
		must(t, st.Migrate(ctx))
		box, err := pgoutbox.New(pool, st)
		must(t, err)
		must(t, box.Migrate(ctx))
		if n == "a" {
			pl := shard.Postgres(pool)
			must(t, pl.Migrate(ctx))
			must(t, pl.Publish(ctx, shard.Placement{Version: 1, Shards: names}, "three shards"))
		}
		stores[n], boxes[n], shards[n], pools[n] = st, box, st, pool
		sep := "?"
		if strings.Contains(base, "?") {
			sep = "&"
		}
		entries = append(entries, n+"="+base+sep+"search_path="+schema)
	}
	t.Setenv(envShards, strings.Join(entries, ","))
	r, err := shard.New(ctx, "a", shards, shard.Postgres(pools["a"]))
	must(t, err)
	var k fence.Key
	for p := int32(0); ; p++ {
		k = fence.Key{Group: "g", Topic: "t", Partition: p}
		if r.Placement().Shard(k) == "a" {
			break
		}
	}
	tok := fence.Token{Epoch: 4}
	_, err = r.Claim(ctx, k, tok, "m1")
	must(t, err)
	must(t, r.Apply(ctx, k, tok, 0, 9, func(ctx context.Context, tx pgx.Tx) error {
		msgs := make([]outbox.Message, 5)
		for i := range msgs {
			msgs[i] = outbox.Message{Topic: "commands", Value: []byte{byte(i)}}
		}
		return boxes["a"].Append(ctx, tx, k, tok, msgs...)
	}))
	_, err = boxes["a"].MarkDelivered(ctx, k, tok, 2)
	must(t, err)

	var out, errb bytes.Buffer
	if code := run([]string{"placement", "move", "-key", k.String(), "-to", "b"}, &out, &errb); code != 0 {
		t.Fatalf("baton placement move exited %d: %s%s", code, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "moved "+k.String()+" from a to b: placement 2") {
		t.Fatalf("baton placement move printed %q", out.String())
	}
	retired, err := stores["a"].Load(ctx, k)
	must(t, err)
	moved, err := stores["b"].Load(ctx, k)
	must(t, err)
	if moved.Position != 9 || moved.Token.Compare(retired.Token) <= 0 {
		t.Fatalf("b's fence %+v after the move, a's %+v: want position 9, above a's", moved, retired)
	}
	pb := pools["b"]
	var last, delivered, pending int64
	must(t, pb.QueryRow(ctx, `SELECT last_seq, delivered_seq FROM baton_outbox_cursors WHERE partition = $1`, k.Partition).Scan(&last, &delivered))
	must(t, pb.QueryRow(ctx, `SELECT count(*) FROM baton_outbox WHERE partition = $1 AND seq > 2`, k.Partition).Scan(&pending))
	if last != 5 || delivered != 2 || pending != 3 {
		t.Fatalf("b's outbox after the move: cursor (%d, %d), %d pending rows; want (5, 2) and 3", last, delivered, pending)
	}
	// The next owner, on b, appends after the sequences a handed out.
	r2, err := shard.New(ctx, "a", shards, shard.Postgres(pools["a"]))
	must(t, err)
	next := fence.Token{Era: moved.Token.Era, Epoch: 5}
	_, err = r2.Claim(ctx, k, next, "m2")
	must(t, err)
	must(t, r2.Apply(ctx, k, next, 10, 10, func(ctx context.Context, tx pgx.Tx) error {
		return boxes["b"].Append(ctx, tx, k, next, outbox.Message{Topic: "commands", Value: []byte("after")})
	}))
	var seq int64
	must(t, pb.QueryRow(ctx, `SELECT seq FROM baton_outbox WHERE partition = $1 AND msg_value = 'after'`, k.Partition).Scan(&seq))
	if seq != 6 {
		t.Fatalf("the first row appended on b after the move has sequence %d, want 6: a's 1 to 5 are not handed out again", seq)
	}

	out.Reset()
	errb.Reset()
	if code := run([]string{"placement", "show"}, &out, &errb); code != 0 {
		t.Fatalf("baton placement show exited %d: %s%s", code, out.String(), errb.String())
	}
	for _, want := range []string{"placement 2\n", "shards: a, b, c (home: a)", k.String() + " -> b", "three shards", "move " + k.String() + " from shard a to shard b (placement 2): publish"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("baton placement show lacks %q:\n%s", want, out.String())
		}
	}
	// Moving it to where it is does nothing; a bad key or shard is a usage error.
	out.Reset()
	if code := run([]string{"placement", "move", "-key", k.String(), "-to", "b"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "on b already") {
		t.Fatalf("a repeated move exited %d: %s", code, out.String())
	}
	for _, args := range [][]string{{"placement", "move", "-key", "g/t", "-to", "b"}, {"placement", "move", "-key", k.String(), "-to", "z"}, {"placement"}, {"placement", "nope"}} {
		if code := run(args, &out, &errb); code != 2 {
			t.Errorf("baton %q exited %d, want 2", args, code)
		}
	}
}

// A move begun and not published (the old fence retired for the next version) is listed by
// 'placement show'.
func TestPlacementShowListsAMoveBegun(t *testing.T) {
	base := testenv.PostgresURL(t)
	ctx := t.Context()
	var entries []string
	shards := map[string]shard.Shard[pgx.Tx]{}
	var home *pgxpool.Pool
	for _, n := range []string{"a", "b"} {
		pool, schema := testenv.Postgres(t)
		st, err := pgfence.New(pool)
		must(t, err)
		must(t, st.Migrate(ctx))
		if n == "a" {
			home = pool
			pl := shard.Postgres(pool)
			must(t, pl.Migrate(ctx))
			must(t, pl.Publish(ctx, shard.Placement{Version: 1, Shards: []string{"a", "b"}}, "two shards"))
		}
		shards[n] = st
		sep := "?"
		if strings.Contains(base, "?") {
			sep = "&"
		}
		entries = append(entries, n+"="+base+sep+"search_path="+schema)
	}
	t.Setenv(envShards, strings.Join(entries, ","))
	r, err := shard.New(ctx, "a", shards, shard.Postgres(home))
	must(t, err)
	k := fence.Key{Group: "g", Topic: "t", Partition: 0}
	must(t, r.Retire(ctx, k, 2, "begun"))
	var out, errb bytes.Buffer
	if code := run([]string{"placement", "show"}, &out, &errb); code != 0 {
		t.Fatalf("baton placement show exited %d: %s", code, errb.String())
	}
	want := k.String() + " retired on " + r.Placement().Shard(k) + " for placement 2, not published"
	if !strings.Contains(out.String(), want) {
		t.Fatalf("baton placement show lacks %q:\n%s", want, out.String())
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
