package outboxconsumer_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/memfence"
	"github.com/batonhq/baton/internal/testkit/netfreeze"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/outboxconsumer"
	"github.com/batonhq/baton/outbox/pgoutbox"
)

// heldDeadLetter is a pgfence store that holds the first Apply of the single poison record
// after its fence check passed (the fence row locked by the transaction) until release, as if
// the process paused there; the held transaction then goes on (its context's cancellation
// ignored: a paused process does not see it) and tries to commit.
type heldDeadLetter struct {
	*pgfence.Store
	poison  int64
	armed   atomic.Bool
	held    atomic.Pointer[fence.Token] // the token whose check passed
	entered chan struct{}
	release chan struct{}
	result  chan error // what the held dead letter's fn returned
}

func (s *heldDeadLetter) Apply(ctx context.Context, k fence.Key, t fence.Token, first, last int64, fn func(context.Context, pgx.Tx) error) error {
	if first != s.poison || last != s.poison || !s.armed.CompareAndSwap(true, false) {
		return s.Store.Apply(ctx, k, t, first, last, fn)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	return s.Store.Apply(ctx, k, t, first, last, func(ctx context.Context, tx pgx.Tx) error {
		s.held.Store(&t) // Advance passed: this transaction holds the fence row
		close(s.entered)
		select {
		case <-s.release:
		case <-ctx.Done():
		}
		err := fn(ctx, tx)
		s.result <- err
		return err
	})
}

// The zombie dead letter through the outbox, on PostgreSQL with the
// real idle_in_transaction_session_timeout, on kfake and on the real broker. Interleaving:
// owner A decides record X is poison; its dead-letter transaction passes the fence check and A
// pauses (network frozen too); PostgreSQL ends the idle transaction, freeing the fence row;
// A's session expires and B takes the partition over, claims it, dead-letters X through the
// outbox (the row relayed by B) and applies what follows. A resumes and goes on with its dead
// letter. Through outboxconsumer.DeadLetters, A's copy is an append in the ended transaction:
// exactly one dead letter of X reaches the topic, B's. Produced directly (the consumer mutant
// DeadLetterProducedDirectly), A's copy reaches the topic too.
func TestZombieDeadLetterThroughTheOutbox(t *testing.T) {
	t.Run("kfake", func(t *testing.T) {
		brokers := testenv.FakeKafka(t, kfake.SeedTopics(1, "orders", "orders.dlq"),
			kfake.BrokerConfigs(map[string]string{"group.min.session.timeout.ms": "500"}))
		zombieDeadLetter(t, brokers, "orders", "orders.dlq", "g", 3*time.Second)
	})
	t.Run("real", func(t *testing.T) {
		brokers := testenv.KafkaBrokers(t)
		src, dlq := testenv.NewTopic(t, brokers, 1), testenv.NewTopic(t, brokers, 1)
		zombieDeadLetter(t, brokers, src, dlq, testenv.UniqueName("g"), 3*time.Second)
	})
}

func zombieDeadLetter(t *testing.T, brokers []string, src, dlq, group string, session time.Duration) {
	pool, schema := testenv.Postgres(t)
	ctx := testenv.Context(t, 3*time.Minute)
	fences, err := pgfence.New(pool)
	if err == nil {
		err = fences.Migrate(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	box, err := pgoutbox.New(pool, fences)
	if err == nil {
		err = box.Migrate(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	// A's connections: PostgreSQL ends a transaction idle for 500ms.
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "500"
	poolA, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer poolA.Close()
	fencesA, err := pgfence.New(poolA)
	if err != nil {
		t.Fatal(err)
	}

	const before, after = 3, 4
	poison := int64(before)
	last := int64(before + after)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(src))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	for i := int64(0); i <= last; i++ {
		v := "ok"
		if i == poison {
			v = "poison"
		}
		recs = append(recs, &kgo.Record{Key: []byte("k"), Value: []byte(v)})
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	sinkA := &heldDeadLetter{Store: fencesA, poison: poison, entered: make(chan struct{}), release: make(chan struct{}), result: make(chan error, 1)}
	sinkA.armed.Store(true)
	handler := consumer.Handler[pgx.Tx](func(_ context.Context, _ pgx.Tx, b *consumer.Batch) error {
		for _, r := range b.Records {
			if string(r.Value) == "poison" {
				return b.Fail(r, errors.New("cannot decode"))
			}
		}
		return nil
	})
	kopts := []kgo.Opt{kgo.SeedBrokers(brokers...), kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.SessionTimeout(session), kgo.RebalanceTimeout(session), kgo.HeartbeatInterval(200 * time.Millisecond),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.MetadataMinAge(100 * time.Millisecond)}
	member := func(sink fence.Sink[pgx.Tx], extra ...kgo.Opt) (*consumer.Consumer[pgx.Tx], *outbox.Relay, *kgo.Client) {
		rc, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, extra...)...)
		if err != nil {
			t.Fatal(err)
		}
		relay, err := outbox.NewRelay(rc, box, outbox.FlushTimeout(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		c, err := consumer.New(group, []string{src}, sink, handler, outboxconsumer.DeadLetters(box),
			consumer.Kafka(append(kopts, extra...)...), consumer.Logger(quiet()), consumer.DeadLetterTopic(dlq),
			consumer.AfterCommit(relay.AfterCommit(), 200*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		return c, relay, rc
	}
	run := func(c *consumer.Consumer[pgx.Tx]) func() {
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = c.Run(rctx) }()
		return func() { cancel(); <-done }
	}

	fz := netfreeze.New()
	defer fz.Thaw()
	a, _, rcA := member(fence.Sink[pgx.Tx](sinkA), kgo.Dialer(fz.Dial), kgo.RequestTimeoutOverhead(time.Second))
	defer rcA.Close()
	stopA := run(a)
	defer stopA()
	select {
	case <-sinkA.entered: // A passed the fence check for X, inside its transaction
	case <-ctx.Done():
		t.Fatal("A never reached the dead letter of the poison record")
	}
	fz.Freeze()

	b, _, rcB := member(fences)
	defer rcB.Close()
	stopB := run(b)
	defer stopB()
	key := fence.Key{Group: group, Topic: src, Partition: 0}
	// B can claim only once PostgreSQL has ended A's transaction (the fence row was locked).
	waitUntil(t, ctx, "B takes over, dead-letters X through the outbox and applies what follows", func() bool {
		st, err := fences.Load(ctx, key)
		return err == nil && st.Position >= last
	})
	fz.Thaw()
	close(sinkA.release)
	var heldErr error
	select {
	case heldErr = <-sinkA.result:
	case <-ctx.Done():
		t.Fatal("A's held dead letter never ran")
	}
	held := sinkA.held.Load()
	if held == nil {
		t.Fatal("A's dead-letter transaction never passed the fence check: the interleaving did not happen")
	}

	// Read the dead-letter topic until B's copy of X arrived and a little longer.
	rd, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(dlq),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	var tokens []string // baton.dlq.token of every dead letter of X
	var withRow int     // those carrying an outbox row's headers
	quietUntil := time.Time{}
	for quietUntil.IsZero() || time.Now().Before(quietUntil) {
		if ctx.Err() != nil {
			t.Fatalf("timed out reading the dead-letter topic; dead letters of X so far under %v", tokens)
		}
		pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		for _, r := range rd.PollFetches(pctx).Records() {
			h := map[string]string{}
			for _, x := range r.Headers {
				h[x.Key] = string(x.Value)
			}
			if h["baton.dlq.offset"] != strconv.FormatInt(poison, 10) {
				continue
			}
			tokens = append(tokens, h["baton.dlq.token"])
			if _, ok := h["baton-seq"]; ok {
				withRow++
			}
			if quietUntil.IsZero() {
				quietUntil = time.Now().Add(2 * time.Second) // A's copy, had it been produced, is already there
			}
		}
		cancel()
	}
	stopB()
	stopA()
	for _, tok := range tokens {
		if tok == held.String() {
			t.Errorf("the zombie A's dead letter of X (token %s) reached the topic", tok)
		}
	}
	if len(tokens) != 1 || withRow != 1 {
		t.Errorf("dead letters of X on the topic under tokens %v (%d relayed from the outbox), want exactly B's, relayed", tokens, withRow)
	}
	// The fault happened: B claimed while A's transaction held the fence row, which only
	// PostgreSQL ending that transaction allows, and A's append then ran on the dead connection.
	if heldErr == nil {
		t.Errorf("A's dead letter in the transaction PostgreSQL ended succeeded")
	} else {
		t.Logf("A's dead letter in the ended transaction: %v", heldErr)
	}
	// Nothing of A's committed: the outbox holds one dead-letter row for X, B's.
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM baton_outbox WHERE dest_topic = $1`, dlq).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("the outbox holds %d dead-letter rows, want 1 (B's)", n)
	}
}

// appendLog is an outbox.Appender that records what it is given and fails with err.
type appendLog struct {
	msgs []outbox.Message
	src  fence.Key
	tok  fence.Token
	err  error
}

func (a *appendLog) Append(_ context.Context, _ int, src fence.Key, tok fence.Token, msgs ...outbox.Message) error {
	a.src, a.tok, a.msgs = src, tok, append(a.msgs, msgs...)
	return a.err
}

// DeadLetters appends the consumer's copy under the batch's key and token, without the headers
// an outbox row may not carry; a copy the outbox refuses for good is a consumer.Permanent
// error.
func TestDeadLettersAppendsTheCopy(t *testing.T) {
	box := &appendLog{}
	dl := outboxconsumer.DeadLetterCopy[int](box)
	{
		k := fence.Key{Group: "g", Topic: "orders", Partition: 2}
		tok := fence.Token{Era: 1, Epoch: 7}
		r := &kgo.Record{Topic: "orders", Partition: 2, Offset: 9, Key: []byte("k"), Value: []byte("v")}
		d := &kgo.Record{Topic: "orders.dlq", Key: r.Key, Value: r.Value, Headers: []kgo.RecordHeader{
			{Key: "app", Value: []byte("1")}, {Key: "Baton-Token", Value: []byte("9.9")}, {Key: "traceparent"},
			{Key: ""}, {Key: "\xff"}, {Key: "baton.dlq.offset", Value: []byte("9")}}}
		if err := dl(context.Background(), 0, &consumer.Batch{Key: k, Token: tok, Records: []*kgo.Record{r}}, d); err != nil {
			t.Fatal(err)
		}
		if len(box.msgs) != 1 || box.src != k || box.tok != tok {
			t.Fatalf("appended %+v under %s %s", box.msgs, box.src, box.tok)
		}
		m := box.msgs[0]
		var keys []string
		for _, x := range m.Headers {
			keys = append(keys, x.Key)
		}
		if m.Topic != "orders.dlq" || string(m.Key) != "k" || string(m.Value) != "v" || len(keys) != 2 || keys[0] != "app" || keys[1] != "baton.dlq.offset" {
			t.Fatalf("appended %s %q=%q with headers %q", m.Topic, m.Key, m.Value, keys)
		}
	}
	for _, e := range []error{outbox.ErrTooLarge, outbox.ErrInvalid,
		fmt.Errorf("%w: message has no topic", outbox.ErrInvalid), fmt.Errorf("%w: invalid header", outbox.ErrInvalid)} {
		box.err = e
		err := dl(context.Background(), 0,
			&consumer.Batch{Records: []*kgo.Record{{}}}, &kgo.Record{Topic: "x"})
		if !consumer.IsPermanent(err) || !errors.Is(err, e) {
			t.Errorf("an outbox refusing the copy with %v: %v, want it permanent", e, err)
		}
	}
	for _, e := range []error{outbox.ErrUnfenced, &fence.StaleError{}, errors.New("connection reset")} {
		box.err = e
		err := dl(context.Background(), 0,
			&consumer.Batch{Records: []*kgo.Record{{}}}, &kgo.Record{Topic: "x"})
		if consumer.IsPermanent(err) || !errors.Is(err, e) {
			t.Errorf("an outbox failing with %v: %v, want it as it is (retried)", e, err)
		}
	}
}

// nilBox is an outbox type for a typed nil.
type nilBox struct{}

func (*nilBox) Append(context.Context, *memfence.Tx, fence.Key, fence.Token, ...outbox.Message) error {
	return nil
}

// DeadLetters is an option, checked by New: a nil outbox, or a typed nil, is refused there, not
// accepted and dereferenced at the first poison record (inside the fenced transaction).
func TestDeadLettersRefusesNilOutbox(t *testing.T) {
	s, err := memfence.New()
	if err != nil {
		t.Fatal(err)
	}
	h := func(context.Context, *memfence.Tx, *consumer.Batch) error { return nil }
	for _, box := range []outbox.Appender[*memfence.Tx]{nil, (*nilBox)(nil)} {
		_, err = consumer.New("g", []string{"t"}, fence.Sink[*memfence.Tx](s), h,
			consumer.Kafka(kgo.SeedBrokers("127.0.0.1:1")), outboxconsumer.DeadLetters(box))
		if !errors.Is(err, consumer.ErrInvalidOption) || !strings.Contains(err.Error(), "nil outbox") {
			t.Errorf("New with DeadLetters(%#v) = %v, want ErrInvalidOption naming the nil outbox", box, err)
		}
	}
}

// AdmitDeadLetters with a nil inbox is refused by New, not dereferenced at the first poison
// record.
func TestAdmitDeadLettersRefusesNilInbox(t *testing.T) {
	s, err := memfence.New()
	if err != nil {
		t.Fatal(err)
	}
	h := func(context.Context, *memfence.Tx, *consumer.Batch) error { return nil }
	_, err = consumer.New("g", []string{"t"}, fence.Sink[*memfence.Tx](s), h,
		consumer.Kafka(kgo.SeedBrokers("127.0.0.1:1")), outboxconsumer.AdmitDeadLetters[*memfence.Tx](nil))
	if !errors.Is(err, consumer.ErrInvalidOption) || !strings.Contains(err.Error(), "nil inbox") {
		t.Errorf("New with AdmitDeadLetters(nil) = %v, want ErrInvalidOption naming the nil inbox", err)
	}
}
