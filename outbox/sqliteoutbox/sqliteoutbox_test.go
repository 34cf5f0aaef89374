package sqliteoutbox_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/sqliteoutbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var src = fence.Key{Group: "g", Topic: "orders", Partition: 1}

func open(t *testing.T) (context.Context, *sqlitefence.Store, *sqliteoutbox.Store) {
	t.Helper()
	ctx := testenv.Context(t, time.Minute)
	fences, err := sqlitefence.Open(filepath.Join(t.TempDir(), "db.sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fences.Close() })
	store, err := sqliteoutbox.New(fences)
	if err == nil {
		err = store.Migrate(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	return ctx, fences, store
}

func TestSQLiteAppendFlushZombies(t *testing.T) {
	ctx, fences, store := open(t)
	bs := testenv.FakeKafka(t, kfake.SeedTopics(1, "dest"))
	old, cur := fence.Token{Epoch: 1}, fence.Token{Epoch: 2}
	if _, err := fences.Claim(ctx, src, old, "test"); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		err := fences.Apply(ctx, src, old, int64(i), int64(i), func(ctx context.Context, tx *sql.Tx) error {
			return store.Append(ctx, tx, src, old, outbox.Message{Topic: "dest", Key: []byte("k"), Value: []byte(strconv.Itoa(i)),
				Headers: []kgo.RecordHeader{{Key: "h", Value: nil}}})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := fences.Claim(ctx, src, cur, "test"); err != nil { // takeover
		t.Fatal(err)
	}
	// The zombie can neither append (even without Advance) nor relay.
	tx, err := fences.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = store.Append(ctx, tx, src, old, outbox.Message{Topic: "dest"})
	_ = tx.Rollback()
	var se *fence.StaleError
	if !errors.As(err, &se) || se.Stored != cur {
		t.Fatalf("zombie Append = %v, want *fence.StaleError", err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(bs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	r, err := outbox.NewRelay(cl, store, outbox.BatchSize(4))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r.Flush(ctx, src, old); !errors.Is(err, fence.ErrStale) || n != 0 {
		t.Fatalf("zombie Flush = %d, %v", n, err)
	}
	if _, err := store.MarkDelivered(ctx, src, old, 6); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("zombie MarkDelivered = %v", err)
	}
	if n, err := r.Flush(ctx, src, cur); err != nil || n != 6 {
		t.Fatalf("owner Flush = %d, %v", n, err)
	}
	if b, err := store.Backlog(ctx, src); err != nil || b != 0 {
		t.Fatalf("backlog %d, %v", b, err)
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(bs...), kgo.ConsumeTopics("dest"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	var recs []*kgo.Record
	for len(recs) < 6 && ctx.Err() == nil {
		recs = append(recs, cons.PollFetches(ctx).Records()...)
	}
	for i, rec := range recs {
		env, err := outbox.ParseEnvelope(rec)
		if err != nil || env.Seq != int64(i+1) || env.Token != old || string(rec.Value) != strconv.Itoa(i) {
			t.Fatalf("record %d: %+v %v value %q", i, env, err, rec.Value)
		}
	}
	if len(recs) != 6 {
		t.Fatalf("got %d records", len(recs))
	}
	if n, err := store.Cleanup(ctx, 0); err != nil || n != 6 {
		t.Fatalf("Cleanup = %d, %v", n, err)
	}
}

func TestSQLiteBadInputWritesNothing(t *testing.T) {
	ctx, fences, store := open(t)
	tok := fence.Token{Epoch: 1}
	if _, err := fences.Claim(ctx, src, tok, "test"); err != nil {
		t.Fatal(err)
	}
	err := fences.Apply(ctx, src, tok, 0, 0, func(ctx context.Context, tx *sql.Tx) error {
		return store.Append(ctx, tx, src, tok, outbox.Message{Topic: "d"}, outbox.Message{Topic: "d", Headers: []kgo.RecordHeader{{Key: "baton-x"}}})
	})
	if !errors.Is(err, outbox.ErrInvalid) {
		t.Fatalf("Append = %v", err)
	}
	if b, err := store.Backlog(ctx, src); err != nil || b != 0 {
		t.Fatalf("backlog %d, %v", b, err)
	}
	// The inbox works over sqlitefence's keyed fence too.
	in, err := outbox.NewInbox[*sql.Tx]("r", fences)
	if err != nil {
		t.Fatal(err)
	}
	rec := &kgo.Record{Topic: "dest", Key: []byte{0, 1}, Headers: []kgo.RecordHeader{
		{Key: "baton-token", Value: []byte("0.1")}, {Key: "baton-seq", Value: []byte("1")}, {Key: "baton-source", Value: []byte("g/orders/1")},
	}}
	for _, want := range []fence.Verdict{fence.Admitted, fence.Duplicate} {
		tx, err := fences.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		v, err := in.Admit(ctx, tx, rec)
		if err != nil || v != want {
			_ = tx.Rollback()
			t.Fatalf("Admit = %s, %v; want %s", v, err, want)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
}
