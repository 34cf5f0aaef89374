package pgoutbox_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/pgoutbox"
)

type env struct {
	t      testing.TB
	ctx    context.Context
	pool   *pgxpool.Pool
	fences *pgfence.Store
	store  *pgoutbox.Store
	src    fence.Key
}

func newEnv(t testing.TB) *env {
	t.Helper()
	ctx := testenv.Context(t, 2*time.Minute)
	pool, _ := testenv.Postgres(t)
	fences, err := pgfence.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := fences.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	store, err := pgoutbox.New(pool, fences)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE accounts (id text PRIMARY KEY, balance bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return &env{t: t, ctx: ctx, pool: pool, fences: fences, store: store, src: fence.Key{Group: "g", Topic: "orders", Partition: 3}}
}

func (e *env) claim(tok fence.Token) {
	e.t.Helper()
	if _, err := e.fences.Claim(e.ctx, e.src, tok, "test"); err != nil {
		e.t.Fatalf("claim %s: %v", tok, err)
	}
}

// apply is what the consumer runtime does for one batch: a fenced transaction with the user's
// state change and its outbox messages.
func (e *env) apply(ctx context.Context, tok fence.Token, pos int64, msgs ...outbox.Message) error {
	return e.fences.Apply(ctx, e.src, tok, pos, pos, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO accounts VALUES ($1, 1) ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + 1`, "acct-"+strconv.FormatInt(pos, 10)); err != nil {
			return err
		}
		return e.store.Append(ctx, tx, e.src, tok, msgs...)
	})
}

func (e *env) count(q string) int64 {
	e.t.Helper()
	var n int64
	if err := e.pool.QueryRow(e.ctx, q).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

func (e *env) backlog() int64 {
	e.t.Helper()
	n, err := e.store.Backlog(e.ctx, e.src)
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

func client(t testing.TB, brokers []string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func relay(t testing.TB, cl *kgo.Client, s outbox.Store, opts ...outbox.RelayOption) *outbox.Relay {
	t.Helper()
	r, err := outbox.NewRelay(cl, s, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// consume reads topic from the start until it has n records, failing the test at ctx's end.
func consume(ctx context.Context, t *testing.T, brokers []string, topic string, n int) []*kgo.Record {
	t.Helper()
	cl := client(t, brokers, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	defer cl.Close()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of %d records from %s: %v", len(out), n, topic, ctx.Err())
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Fatalf("fetch: %v", err) })
		out = append(out, fs.Records()...)
	}
	return out
}

func hdr(r *kgo.Record, k string) string {
	for _, h := range r.Headers {
		if h.Key == k {
			return string(h.Value)
		}
	}
	return ""
}

// brokers runs f against kfake and, when configured, the real broker.
func brokers(t *testing.T, f func(t *testing.T, brokers []string, topic string)) {
	t.Run("kfake", func(t *testing.T) {
		f(t, testenv.FakeKafka(t, kfake.SeedTopics(1, "dest")), "dest")
	})
	t.Run("kafka", func(t *testing.T) {
		b := testenv.KafkaBrokers(t)
		f(t, b, testenv.NewTopic(t, b, 1))
	})
}

var traceID = trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}

func TestAppendAndFlushDeliverInSequenceOrderWithHeaders(t *testing.T) {
	brokers(t, func(t *testing.T, bs []string, topic string) {
		e := newEnv(t)
		tok := fence.Token{Epoch: 4}
		e.claim(tok)
		// The state change runs inside a span; its trace must reach the published records.
		ctx := trace.ContextWithSpanContext(e.ctx, trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: traceID, SpanID: trace.SpanID{1, 1, 1, 1, 1, 1, 1, 1}, TraceFlags: trace.FlagsSampled,
		}))
		const batches, per = 5, 5
		for b := range batches {
			var msgs []outbox.Message
			for i := range per {
				n := b*per + i
				msgs = append(msgs, outbox.Message{
					Topic: topic, Key: []byte("k" + strconv.Itoa(n%3)), Value: []byte(strconv.Itoa(n)),
					Headers: []kgo.RecordHeader{{Key: "app", Value: []byte("v" + strconv.Itoa(n))}},
				})
			}
			if b == 2 {
				msgs[0].IdempotencyKey = "payment-42"
			}
			if err := e.apply(ctx, tok, int64(b), msgs...); err != nil {
				t.Fatal(err)
			}
		}
		if got := e.backlog(); got != batches*per {
			t.Fatalf("backlog %d, want %d", got, batches*per)
		}
		r := relay(t, client(t, bs), e.store, outbox.BatchSize(7))
		n, err := r.Flush(e.ctx, e.src, tok)
		if err != nil || n != batches*per {
			t.Fatalf("Flush = %d, %v; want %d", n, err, batches*per)
		}
		if got := e.backlog(); got != 0 {
			t.Fatalf("backlog after flush %d", got)
		}
		if n, err := r.Flush(e.ctx, e.src, tok); err != nil || n != 0 {
			t.Fatalf("second Flush = %d, %v; want nothing to do", n, err)
		}
		recs := consume(e.ctx, t, bs, topic, batches*per)
		for i, rec := range recs {
			seq := int64(i + 1)
			wantIK := e.src.String() + "/" + strconv.FormatInt(seq, 10)
			if seq == 11 {
				wantIK = "payment-42"
			}
			switch {
			case string(rec.Value) != strconv.Itoa(i):
				t.Fatalf("record %d has value %q: out of order", i, rec.Value)
			case hdr(rec, "baton-seq") != strconv.FormatInt(seq, 10):
				t.Fatalf("record %d: seq header %q", i, hdr(rec, "baton-seq"))
			case hdr(rec, "baton-token") != "0.4":
				t.Fatalf("record %d: token header %q", i, hdr(rec, "baton-token"))
			case hdr(rec, "baton-source") != "g/orders/3":
				t.Fatalf("record %d: source header %q", i, hdr(rec, "baton-source"))
			case hdr(rec, "baton-idempotency-key") != wantIK:
				t.Fatalf("record %d: idempotency key %q, want %q", i, hdr(rec, "baton-idempotency-key"), wantIK)
			case hdr(rec, "app") != "v"+strconv.Itoa(i):
				t.Fatalf("record %d: app header %q", i, hdr(rec, "app"))
			case string(rec.Key) != "k"+strconv.Itoa(i%3):
				t.Fatalf("record %d: key %q", i, rec.Key)
			case !strings.HasPrefix(hdr(rec, "traceparent"), "00-"+traceID.String()+"-"):
				t.Fatalf("record %d: traceparent %q does not continue trace %s", i, hdr(rec, "traceparent"), traceID)
			}
		}
	})
}

func TestZombieAppendIsRefusedByTheFence(t *testing.T) {
	e := newEnv(t)
	old, cur := fence.Token{Epoch: 1}, fence.Token{Epoch: 2}
	e.claim(old)
	e.claim(cur) // takeover
	// The zombie forgets Advance and appends directly: Append's own fence check refuses it.
	tx, err := e.pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) // a failed check must not leave the connection held
	err = e.store.Append(e.ctx, tx, e.src, old, outbox.Message{Topic: "dest", Value: []byte("x")})
	var se *fence.StaleError
	if !errors.As(err, &se) || se.Stored != cur || se.Presented != old {
		t.Fatalf("zombie Append = %v, want *fence.StaleError stored %s presented %s", err, cur, old)
	}
	// Even if the zombie commits what it has, nothing was written.
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.count(`SELECT count(*) FROM baton_outbox`) + e.count(`SELECT count(*) FROM baton_outbox_cursors`); n != 0 {
		t.Fatalf("zombie wrote %d rows", n)
	}
	// The same Append with the current token succeeds: the refusal was the fence's.
	if err := e.apply(e.ctx, cur, 0, outbox.Message{Topic: "dest", Value: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	// A token never claimed (higher than stored) and an unclaimed key are ErrUnfenced.
	for _, c := range []struct {
		key fence.Key
		tok fence.Token
	}{{e.src, fence.Token{Epoch: 9}}, {fence.Key{Group: "g", Topic: "other", Partition: 0}, cur}} {
		tx, err := e.pool.Begin(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		err = e.store.Append(e.ctx, tx, c.key, c.tok, outbox.Message{Topic: "dest"})
		_ = tx.Rollback(e.ctx)
		if !errors.Is(err, outbox.ErrUnfenced) {
			t.Fatalf("Append(%s, %s) = %v, want ErrUnfenced", c.key, c.tok, err)
		}
	}
}

// hookStore runs a hook before marking, to act between publish and mark.
type hookStore struct {
	outbox.Store
	beforeMark func(ctx context.Context) context.Context
}

func (h hookStore) MarkDelivered(ctx context.Context, src fence.Key, tok fence.Token, through int64) (int64, error) {
	if h.beforeMark != nil {
		ctx = h.beforeMark(ctx)
	}
	return h.Store.MarkDelivered(ctx, src, tok, through)
}

func TestZombieRelayCannotMarkAfterTakeover(t *testing.T) {
	bs := testenv.FakeKafka(t, kfake.SeedTopics(1, "dest"))
	e := newEnv(t)
	old, cur := fence.Token{Epoch: 1}, fence.Token{Epoch: 2}
	e.claim(old)
	for i := range 4 {
		if err := e.apply(e.ctx, old, int64(i), outbox.Message{Topic: "dest", Key: []byte("k"), Value: []byte{byte(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	// The zombie publishes, then loses the partition before it marks.
	zombie := relay(t, client(t, bs), hookStore{Store: e.store, beforeMark: func(ctx context.Context) context.Context {
		e.claim(cur)
		return ctx
	}})
	n, err := zombie.Flush(e.ctx, e.src, old)
	if !errors.Is(err, fence.ErrStale) || n != 0 {
		t.Fatalf("zombie Flush = %d, %v; want 0, ErrStale", n, err)
	}
	if got := e.backlog(); got != 4 {
		t.Fatalf("backlog %d after the zombie's refused mark, want 4", got)
	}
	// A zombie that notices nothing keeps failing and cannot skip rows either.
	if n, err := zombie.Flush(e.ctx, e.src, old); !errors.Is(err, fence.ErrStale) || n != 0 {
		t.Fatalf("second zombie Flush = %d, %v", n, err)
	}
	if _, err := e.store.MarkDelivered(e.ctx, e.src, old, 4); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("zombie MarkDelivered = %v, want ErrStale", err)
	}
	owner := relay(t, client(t, bs), e.store)
	if n, err := owner.Flush(e.ctx, e.src, cur); err != nil || n != 4 {
		t.Fatalf("new owner Flush = %d, %v; want 4", n, err)
	}
	if got := e.backlog(); got != 0 {
		t.Fatalf("backlog %d", got)
	}
	// The zombie's copies and the owner's carry the same original token and seq: the inbox
	// admits each once.
	recs := consume(e.ctx, t, bs, "dest", 8)
	in, err := outbox.NewInbox[pgx.Tx]("receiver", e.fences)
	if err != nil {
		t.Fatal(err)
	}
	admitted := 0
	for _, rec := range recs {
		if hdr(rec, "baton-token") != "0.1" {
			t.Fatalf("re-published row carries token %q, want the original 0.1", hdr(rec, "baton-token"))
		}
		v := admit(t, e, in, rec)
		if v == fence.Admitted {
			admitted++
		}
	}
	if admitted != 4 {
		t.Fatalf("inbox admitted %d of 8 copies, want 4", admitted)
	}
}

func admit(t *testing.T, e *env, in *outbox.Inbox[pgx.Tx], rec *kgo.Record) fence.Verdict {
	t.Helper()
	var v fence.Verdict
	err := pgx.BeginFunc(e.ctx, e.pool, func(tx pgx.Tx) error {
		var err error
		v, err = in.Admit(e.ctx, tx, rec)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestRelayKilledBetweenPublishAndMarkRedeliversExactlyOnceAfterInbox(t *testing.T) {
	brokers(t, func(t *testing.T, bs []string, topic string) {
		e := newEnv(t)
		tok := fence.Token{Epoch: 7}
		e.claim(tok)
		const total = 30
		for b := range 3 {
			var msgs []outbox.Message
			for i := range total / 3 {
				n := b*total/3 + i
				msgs = append(msgs, outbox.Message{Topic: topic, Key: []byte("k" + strconv.Itoa(n%4)), Value: []byte(strconv.Itoa(n))})
			}
			if err := e.apply(e.ctx, tok, int64(b), msgs...); err != nil {
				t.Fatal(err)
			}
		}
		// The first relay is killed after its first batch is acknowledged, before the mark.
		ctx, kill := context.WithCancel(e.ctx)
		r1 := relay(t, client(t, bs), hookStore{Store: e.store, beforeMark: func(ctx context.Context) context.Context {
			kill()
			return ctx
		}}, outbox.BatchSize(12))
		if n, err := r1.Flush(ctx, e.src, tok); !errors.Is(err, context.Canceled) || n != 0 {
			t.Fatalf("killed Flush = %d, %v; want 0, context.Canceled", n, err)
		}
		if got := e.backlog(); got != total {
			t.Fatalf("backlog %d after the kill, want %d", got, total)
		}
		r2 := relay(t, client(t, bs), e.store, outbox.BatchSize(12))
		if n, err := r2.Flush(e.ctx, e.src, tok); err != nil || n != total {
			t.Fatalf("restarted Flush = %d, %v", n, err)
		}
		recs := consume(e.ctx, t, bs, topic, total+12)
		if len(recs) != total+12 {
			t.Fatalf("got %d records, want %d (one batch twice)", len(recs), total+12)
		}
		in, err := outbox.NewInbox[pgx.Tx]("receiver", e.fences)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]int{}
		last := map[string]int{}
		for _, rec := range recs {
			if admit(t, e, in, rec) != fence.Admitted {
				continue
			}
			v, _ := strconv.Atoi(string(rec.Value))
			seen[string(rec.Value)]++
			if p, ok := last[string(rec.Key)]; ok && v <= p {
				t.Fatalf("key %s: %d admitted after %d", rec.Key, v, p)
			}
			last[string(rec.Key)] = v
		}
		for i := range total {
			if seen[strconv.Itoa(i)] != 1 {
				t.Fatalf("message %d admitted %d times, want exactly once", i, seen[strconv.Itoa(i)])
			}
		}
	})
}

func TestKafkaUnavailableKeepsRowsPendingThenDrains(t *testing.T) {
	bs := testenv.FakeKafka(t, kfake.SeedTopics(1, "dest"))
	e := newEnv(t)
	tok := fence.Token{Epoch: 1}
	e.claim(tok)
	for i := range 10 {
		if err := e.apply(e.ctx, tok, int64(i), outbox.Message{Topic: "dest", Key: []byte("k"), Value: []byte(strconv.Itoa(i))}); err != nil {
			t.Fatal(err)
		}
	}
	// A client with a dead seed: nothing is acknowledged; the records fail after the delivery
	// timeout, well inside the Flush's context, so the error Flush returns is the produce
	// failure it must propagate (not its own deadline).
	dead := relay(t, client(t, []string{"127.0.0.1:1"}, kgo.RecordDeliveryTimeout(time.Second)), e.store, outbox.BatchSize(4))
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	n, err := dead.Flush(ctx, e.src, tok)
	cancel()
	if err == nil || n != 0 || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Flush with Kafka down = %d, %v; want the produce error", n, err)
	}
	if got := e.backlog(); got != 10 {
		t.Fatalf("backlog %d with Kafka down, want 10", got)
	}
	live := relay(t, client(t, bs), e.store, outbox.BatchSize(4))
	if n, err := live.Flush(e.ctx, e.src, tok); err != nil || n != 10 {
		t.Fatalf("Flush with Kafka up = %d, %v", n, err)
	}
	if got := e.backlog(); got != 0 {
		t.Fatalf("backlog %d", got)
	}
	for i, rec := range consume(e.ctx, t, bs, "dest", 10) {
		if string(rec.Value) != strconv.Itoa(i) {
			t.Fatalf("record %d is %q", i, rec.Value)
		}
	}
}

func TestInboxVerdictsAreAtomicWithTheReceiversWrite(t *testing.T) {
	e := newEnv(t)
	in, err := outbox.NewInbox[pgx.Tx]("billing", e.fences)
	if err != nil {
		t.Fatal(err)
	}
	rec := func(tok string, seq int, key string) *kgo.Record {
		return &kgo.Record{Topic: "invoices", Key: []byte(key), Value: []byte(tok + "/" + strconv.Itoa(seq)), Headers: []kgo.RecordHeader{
			{Key: "baton-token", Value: []byte(tok)},
			{Key: "baton-seq", Value: []byte(strconv.Itoa(seq))},
			{Key: "baton-source", Value: []byte("g/orders/3")},
		}}
	}
	// receive admits and applies the effect in one transaction; fail rolls both back.
	receive := func(r *kgo.Record, fail bool) fence.Verdict {
		var v fence.Verdict
		err := pgx.BeginFunc(e.ctx, e.pool, func(tx pgx.Tx) error {
			var err error
			if v, err = in.Admit(e.ctx, tx, r); err != nil || v != fence.Admitted {
				return err
			}
			if _, err := tx.Exec(e.ctx, `INSERT INTO accounts VALUES ($1, 1) ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + 1`, string(r.Key)); err != nil {
				return err
			}
			if fail {
				return errors.New("receiver fails after admit")
			}
			return nil
		})
		if err != nil && !fail {
			t.Fatal(err)
		}
		return v
	}
	steps := []struct {
		r    *kgo.Record
		fail bool
		want fence.Verdict
	}{
		{rec("0.1", 5, "a"), true, fence.Admitted},  // rolled back: the admission is undone too
		{rec("0.1", 5, "a"), false, fence.Admitted}, // so the retry is admitted
		{rec("0.1", 5, "a"), false, fence.Duplicate},
		{rec("0.1", 4, "a"), false, fence.Duplicate},
		{rec("0.1", 3, "b"), false, fence.Admitted}, // per key
		{rec("0.2", 6, "a"), false, fence.Admitted},
		{rec("0.1", 7, "a"), false, fence.Stale}, // older owner, even with a higher seq
	}
	for i, s := range steps {
		if got := receive(s.r, s.fail); got != s.want {
			t.Fatalf("step %d: %s, want %s", i, got, s.want)
		}
	}
	if n := e.count(`SELECT balance FROM accounts WHERE id = 'a'`); n != 2 {
		t.Fatalf("balance of a is %d, want 2 (only admitted, committed records applied)", n)
	}
	// Another destination topic, or another partition of the same one, is another scope:
	// a record read there is compared only with records read there.
	other := rec("0.1", 5, "a")
	other.Topic = "receipts"
	if v := receive(other, false); v != fence.Admitted {
		t.Fatalf("seq 5 of a read from another topic: %s, want admitted", v)
	}
	other = rec("0.1", 5, "a")
	other.Partition = 1
	if v := receive(other, false); v != fence.Admitted {
		t.Fatalf("seq 5 of a read from another partition: %s, want admitted", v)
	}
	if v := receive(other, false); v != fence.Duplicate {
		t.Fatalf("seq 5 of a read again from that partition: %s, want duplicate", v)
	}
	// Records without the relay's headers, and keyless ones, are refused clearly.
	err = pgx.BeginFunc(e.ctx, e.pool, func(tx pgx.Tx) error {
		if _, err := in.Admit(e.ctx, tx, &kgo.Record{Key: []byte("a")}); !errors.Is(err, outbox.ErrNotBaton) {
			t.Errorf("plain record: %v, want ErrNotBaton", err)
		}
		r := rec("0.1", 1, "")
		if _, err := in.Admit(e.ctx, tx, r); !errors.Is(err, outbox.ErrNoKey) {
			t.Errorf("keyless record: %v, want ErrNoKey", err)
		}
		r = rec("0.1", 1, "a")
		r.Topic = ""
		if _, err := in.Admit(e.ctx, tx, r); !errors.Is(err, outbox.ErrInvalid) {
			t.Errorf("record without a topic: %v, want ErrInvalid", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestBadInputIsRefusedBeforeAnythingIsWritten(t *testing.T) {
	e := newEnv(t)
	tok := fence.Token{Epoch: 1}
	e.claim(tok)
	s, err := pgoutbox.New(e.pool, e.fences, pgoutbox.MaxMessageBytes(100))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		m    outbox.Message
		want error
	}{
		{"no topic", outbox.Message{Value: []byte("x")}, outbox.ErrInvalid},
		{"too large", outbox.Message{Topic: "d", Key: make([]byte, 50), Value: make([]byte, 51)}, outbox.ErrTooLarge},
		{"large header", outbox.Message{Topic: "d", Headers: []kgo.RecordHeader{{Key: "h", Value: make([]byte, 100)}}}, outbox.ErrTooLarge},
		{"empty header key", outbox.Message{Topic: "d", Headers: []kgo.RecordHeader{{Key: ""}}}, outbox.ErrInvalid},
		{"reserved header", outbox.Message{Topic: "d", Headers: []kgo.RecordHeader{{Key: "Baton-Seq"}}}, outbox.ErrInvalid},
		{"traceparent header", outbox.Message{Topic: "d", Headers: []kgo.RecordHeader{{Key: "traceparent"}}}, outbox.ErrInvalid},
		{"bad topic", outbox.Message{Topic: "a/b"}, outbox.ErrInvalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := e.fences.Apply(e.ctx, e.src, tok, 0, 0, func(ctx context.Context, tx pgx.Tx) error {
				// A good message first: the bad one must refuse the whole call.
				return s.Append(ctx, tx, e.src, tok, outbox.Message{Topic: "d", Value: []byte("ok")}, c.m)
			})
			if !errors.Is(err, c.want) {
				t.Fatalf("Append = %v, want %v", err, c.want)
			}
			if n := e.count(`SELECT count(*) FROM baton_outbox`); n != 0 {
				t.Fatalf("%d rows written", n)
			}
		})
	}
	// Refused before any statement: even a caller that commits anyway has written nothing.
	tx, err := e.pool.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) // a failed check must not leave the connection held
	if err := s.Append(e.ctx, tx, e.src, tok, outbox.Message{}); !errors.Is(err, outbox.ErrInvalid) {
		t.Fatal(err)
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.count(`SELECT count(*) FROM baton_outbox_cursors`); n != 0 {
		t.Fatalf("cursor row written for refused input")
	}
}

func TestSequencesContinueAcrossOwnersAndCleanup(t *testing.T) {
	bs := testenv.FakeKafka(t, kfake.SeedTopics(1, "dest"))
	e := newEnv(t)
	msg := outbox.Message{Topic: "dest", Key: []byte("k")}
	e.claim(fence.Token{Epoch: 1})
	for i := range 3 {
		if err := e.apply(e.ctx, fence.Token{Epoch: 1}, int64(i), msg, msg); err != nil {
			t.Fatal(err)
		}
	}
	r := relay(t, client(t, bs), e.store)
	if n, err := r.Flush(e.ctx, e.src, fence.Token{Epoch: 1}); err != nil || n != 6 {
		t.Fatalf("Flush = %d, %v", n, err)
	}
	if n, err := e.store.Cleanup(e.ctx, 0); err != nil || n != 6 {
		t.Fatalf("Cleanup = %d, %v; want the 6 delivered rows", n, err)
	}
	e.claim(fence.Token{Epoch: 2})
	if err := e.apply(e.ctx, fence.Token{Epoch: 2}, 10, msg); err != nil {
		t.Fatal(err)
	}
	if n, err := e.store.Cleanup(e.ctx, 0); err != nil || n != 0 {
		t.Fatalf("Cleanup deleted %d undelivered rows, %v", n, err)
	}
	rows, err := e.store.Pending(e.ctx, e.src, fence.Token{Epoch: 2}, 10)
	if err != nil || len(rows) != 1 || rows[0].Seq != 7 || rows[0].IdempotencyKey != fmt.Sprintf("%s/7", e.src) {
		t.Fatalf("Pending = %+v, %v; want seq 7 after cleanup and takeover", rows, err)
	}
}
