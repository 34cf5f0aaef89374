package main

import (
	"context"
	"testing"
	"time"

	"github.com/batonhq/baton/cmd/baton/internal/bench"
	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/redisfence"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// TestRedisFoldAcrossBatches drives the redis- designs' handler through both of their sinks
// with each key's records spread over several batches (the bench's smoke sizes fit a
// partition in one batch): the stored folds are read and merged, and the check passes; a
// batch applied twice by the unfenced sink makes the check fail, and the fence refuses it.
func TestRedisFoldAcrossBatches(t *testing.T) {
	addr := testenv.RedisAddr(t)
	ctx := testenv.Context(t, 30*time.Second)
	const keys, perKey, batch = 7, 9, 10
	recs := bench.Records(keys, perKey)
	for i, r := range recs {
		r.Offset = int64(i)
	}
	batches := func(k fence.Key, tok fence.Token) []*consumer.Batch {
		var out []*consumer.Batch
		for i := 0; i < len(recs); i += batch {
			out = append(out, &consumer.Batch{Key: k, Token: tok, Records: recs[i:min(i+batch, len(recs))]})
		}
		return out
	}
	stamp := time.Now().UTC().Format("150405.000000")
	for _, fenced := range []bool{false, true} {
		job := bench.Job{Group: "baton-bench-test-" + stamp, Topic: "t-" + map[bool]string{false: "unfenced", true: "fenced"}[fenced],
			Redis: addr, Keys: keys, Records: keys * perKey, Partitions: 1}
		fold := redisFold{addr: addr}
		t.Cleanup(func() { _ = fold.Clean(context.Background(), job) })
		c := redisClient(job)
		defer c.Close()
		k := fence.Key{Group: job.Group, Topic: job.Topic}
		tok := fence.Token{Epoch: 1}
		var last *consumer.Batch
		if fenced {
			s, err := durableOrNot(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Claim(ctx, k, tok, "me"); err != nil {
				t.Fatal(err)
			}
			h, _ := redisFoldHandler[*redisfence.Tx](c, job)(ctx, k, tok)
			for _, b := range batches(k, tok) {
				first, end := b.Records[0].Offset, b.Records[len(b.Records)-1].Offset
				if err := s.Apply(ctx, k, tok, first, end, func(ctx context.Context, tx *redisfence.Tx) error { return h(ctx, tx, b) }); err != nil {
					t.Fatal(err)
				}
				last = b
			}
			if err := fold.Check(ctx, job); err != nil {
				t.Fatalf("fenced: %v", err)
			}
			first, end := last.Records[0].Offset, last.Records[len(last.Records)-1].Offset
			if err := s.Apply(ctx, k, tok, first, end, func(ctx context.Context, tx *redisfence.Tx) error { return h(ctx, tx, last) }); err == nil {
				t.Fatal("the fence took the last batch twice")
			}
			if err := fold.Check(ctx, job); err != nil {
				t.Fatalf("fenced, after the refused copy: %v", err)
			}
			continue
		}
		h, _ := redisFoldHandler[*pipeTx](c, job)(ctx, k, tok)
		sink := unfencedRedis{c}
		for _, b := range batches(k, tok) {
			if err := sink.Apply(ctx, k, tok, 0, 0, func(ctx context.Context, tx *pipeTx) error { return h(ctx, tx, b) }); err != nil {
				t.Fatal(err)
			}
			last = b
		}
		if err := fold.Check(ctx, job); err != nil {
			t.Fatalf("unfenced: %v", err)
		}
		if err := sink.Apply(ctx, k, tok, 0, 0, func(ctx context.Context, tx *pipeTx) error { return h(ctx, tx, last) }); err != nil {
			t.Fatal(err)
		}
		if err := fold.Check(ctx, job); err == nil {
			t.Fatal("unfenced: the check passed a batch applied twice")
		}
	}
}
