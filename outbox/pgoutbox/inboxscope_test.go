package pgoutbox_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/outbox"
)

// One receiver reads two destination topics with one inbox, every record of the second topic
// before any of the first, on PostgreSQL with kfake and the real broker:
// each record is applied exactly once, and a second delivery of all of them is dropped.
func TestInboxReadsTwoDestinationTopicsOutOfOrder(t *testing.T) {
	brokers(t, func(t *testing.T, bs []string, a string) {
		e := newEnv(t)
		b := testenv.NewTopic(t, bs, 1)
		tok := fence.Token{Epoch: 1}
		e.claim(tok)
		for i := range 4 {
			if err := e.apply(e.ctx, tok, int64(i+1),
				outbox.Message{Topic: a, Key: []byte("k"), Value: []byte(fmt.Sprintf("a%d", 2*i+1))},
				outbox.Message{Topic: b, Key: []byte("k"), Value: []byte(fmt.Sprintf("b%d", 2*i+2))}); err != nil {
				t.Fatal(err)
			}
		}
		if n, err := relay(t, client(t, bs), e.store).Flush(e.ctx, e.src, tok); err != nil || n != 8 {
			t.Fatalf("Flush = %d, %v", n, err)
		}
		recsA, recsB := consume(e.ctx, t, bs, a, 4), consume(e.ctx, t, bs, b, 4)
		in, err := outbox.NewInbox[pgx.Tx]("receiver", e.fences)
		if err != nil {
			t.Fatal(err)
		}
		applied := map[string]int{}
		admit := func(r *kgo.Record) fence.Verdict {
			var v fence.Verdict
			if err := pgx.BeginFunc(e.ctx, e.pool, func(tx pgx.Tx) error {
				var err error
				v, err = in.Admit(e.ctx, tx, r)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if v == fence.Admitted {
				applied[string(r.Value)]++
			}
			return v
		}
		for _, r := range slices.Concat(recsB, recsA) {
			if v := admit(r); v != fence.Admitted {
				t.Errorf("first delivery of %q: %s, want admitted", r.Value, v)
			}
		}
		for _, r := range slices.Concat(recsA, recsB) {
			if v := admit(r); v != fence.Duplicate {
				t.Errorf("second delivery of %q: %s, want duplicate", r.Value, v)
			}
		}
		if len(applied) != 8 {
			t.Fatalf("applied %v, want 8 distinct records once each", applied)
		}
		for v, n := range applied {
			if n != 1 {
				t.Errorf("%s applied %d times", v, n)
			}
		}
	})
}
