package pgoutbox_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/outbox"
)

// QueueAppend puts the outbox rows in the same pipelined batch as the fence advance: the
// current owner's rows are written with gap-free sequences; a zombie's batch is refused by the
// fence (StaleError) and writes no row; bad input is refused before anything is queued.
func TestQueueAppendInFencedBatch(t *testing.T) {
	e := newEnv(t)
	old, cur := fence.Token{Epoch: 1}, fence.Token{Epoch: 2}
	e.claim(old)
	msgs := []outbox.Message{{Topic: "dest", Key: []byte("a"), Value: []byte("1")}, {Topic: "dest", Key: []byte("b"), Value: []byte("2")}}
	if err := e.fences.ApplyBatch(e.ctx, e.src, old, 0, 0, func(b *pgx.Batch) error {
		return e.store.QueueAppend(e.ctx, b, e.src, old, msgs...)
	}); err != nil {
		t.Fatal(err)
	}
	if n := e.count(`SELECT count(*) FROM baton_outbox`); n != 2 {
		t.Fatalf("%d rows after the owner's batch, want 2", n)
	}
	e.claim(cur) // takeover
	attempted := false
	err := e.fences.ApplyBatch(e.ctx, e.src, old, 1, 1, func(b *pgx.Batch) error {
		attempted = true
		return e.store.QueueAppend(e.ctx, b, e.src, old, msgs...)
	})
	var se *fence.StaleError
	if !attempted || !errors.As(err, &se) || se.Stored != cur {
		t.Fatalf("zombie batch (attempted %v) = %v, want *fence.StaleError stored %s", attempted, err, cur)
	}
	if n := e.count(`SELECT count(*) FROM baton_outbox`); n != 2 {
		t.Fatalf("%d rows after the zombie's batch, want still 2", n)
	}
	if err := e.fences.ApplyBatch(e.ctx, e.src, cur, 1, 1, func(b *pgx.Batch) error {
		return e.store.QueueAppend(e.ctx, b, e.src, cur, msgs...)
	}); err != nil {
		t.Fatal(err)
	}
	if n := e.count(`SELECT max(seq) FROM baton_outbox WHERE era = 0 AND epoch = 2`); n != 4 {
		t.Fatalf("the new owner's last seq is %d, want 4 (gap-free after the refused batch)", n)
	}
	b := &pgx.Batch{}
	if err := e.store.QueueAppend(e.ctx, b, e.src, cur, outbox.Message{}); !errors.Is(err, outbox.ErrInvalid) || b.Len() != 0 {
		t.Fatalf("bad input: %v with %d queued, want ErrInvalid and nothing queued", err, b.Len())
	}
}
