package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
	"github.com/batonhq/baton/internal/testkit/netfreeze"
)

// errTxEnded is what a statement or a commit of a transaction the database ended returns.
var errTxEnded = errors.New("terminating connection due to idle-in-transaction timeout (test)")

// lockEndsSink lets the one Apply of a single poison record that comes first pass the fence
// check, then ends its transaction (as PostgreSQL's idle_in_transaction_session_timeout does
// while the process is paused: the fence row is free again), and holds the caller there until
// release. The caller's fn then runs in what is left of the transaction, which commits
// nothing, and the Apply fails as a dead connection's would. fn runs with its context's
// cancellation ignored: a paused process does not see it either.
type lockEndsSink struct {
	*memfence.Store
	poison  int64
	armed   atomic.Bool
	checked atomic.Bool // the held Apply passed the fence check
	held    fence.Token // its token, once checked
	entered chan struct{}
	release chan struct{}
	result  chan error
}

func newLockEndsSink(s *memfence.Store, poison int64) *lockEndsSink {
	l := &lockEndsSink{Store: s, poison: poison, entered: make(chan struct{}), release: make(chan struct{}), result: make(chan error, 1)}
	l.armed.Store(true)
	return l
}

func (s *lockEndsSink) Apply(ctx context.Context, k fence.Key, t fence.Token, first, last int64, fn func(context.Context, *memfence.Tx) error) error {
	if first != s.poison || last != s.poison || !s.armed.CompareAndSwap(true, false) {
		return s.Store.Apply(ctx, k, t, first, last, fn)
	}
	tx, err := s.Store.Begin(ctx)
	if err != nil {
		return err
	}
	if err := s.Store.Advance(ctx, tx, k, t, first, last); err != nil {
		_ = tx.Rollback()
		return err
	}
	s.held = t
	s.checked.Store(true)
	_ = tx.Rollback() // the database ended the transaction: the fence row is free
	close(s.entered)
	select {
	case <-s.release:
	case <-time.After(2 * time.Minute): // never hang the package: the test fails on its own bounds first
	}
	ctx = context.WithoutCancel(ctx)
	dead, err := s.Store.Begin(ctx) // what is left of the ended transaction: it never commits
	if err != nil {
		return err
	}
	err = fn(ctx, dead)
	_ = dead.Rollback()
	s.result <- err
	return errors.Join(err, errTxEnded)
}

// dlHandler applies records as "v/<offset>" and takes dead letters into the fenced transaction
// as "dlq/<offset>" = the token of the transaction (a consumer.FencedDeadLetters function).
type dlHandler struct {
	mu    sync.Mutex
	calls []fence.Token // tokens of every DeadLetter call, committed or not
}

func (h *dlHandler) Handle(_ context.Context, tx *memfence.Tx, b *consumer.Batch) error {
	for _, r := range b.Records {
		if string(r.Value) == "poison" {
			return b.Fail(r, errors.New("cannot decode"))
		}
		if err := tx.Put("v/"+strconv.FormatInt(r.Offset, 10), []byte(b.Token.String())); err != nil {
			return err
		}
	}
	return nil
}

func (h *dlHandler) DeadLetter(_ context.Context, tx *memfence.Tx, b *consumer.Batch, d *kgo.Record) error {
	h.mu.Lock()
	h.calls = append(h.calls, b.Token)
	h.mu.Unlock()
	r := b.Records[0]
	var off string
	for _, x := range d.Headers {
		if x.Key == consumer.HeaderDLQOffset {
			off = string(x.Value)
		}
	}
	if len(b.Records) != 1 || off != strconv.FormatInt(r.Offset, 10) || string(d.Value) != string(r.Value) {
		return fmt.Errorf("DeadLetter got batch %v and copy of offset %q", b.Records, off)
	}
	return tx.Put("dlq/"+off, []byte(b.Token.String()))
}

func (h *dlHandler) tokens() []fence.Token {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]fence.Token(nil), h.calls...)
}

// A zombie's dead letter (mutant DeadLetterProducedDirectly). Interleaving: owner A decides
// record X is poison; its dead-letter transaction passes the fence check; A pauses (its network
// frozen too) and the database ends the transaction, freeing the fence row; A's session
// expires, B is assigned the partition, claims it, dead-letters X itself and applies what
// follows. A resumes and carries on with its dead letter. With a handler that takes dead
// letters into the transaction (consumer.FencedDeadLetters), A's copy is written in the ended
// transaction and never commits: exactly one dead letter of X exists, B's, and nothing
// reaches the dead-letter topic. Produced directly, A's copy would reach the topic.
func TestZombieNeverDeadLettersThroughTheTransaction(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders", "orders.dlq"))
	const before, after = 3, 4
	poison := int64(before)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	var recs []*kgo.Record
	for i := 0; i < before+1+after; i++ {
		v := "ok"
		if int64(i) == poison {
			v = "poison"
		}
		recs = append(recs, &kgo.Record{Key: []byte("k"), Value: []byte(v)})
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	last := int64(before + after)
	store := newStore(t)
	sink := newLockEndsSink(store, poison)
	h := &dlHandler{}
	factory := func(context.Context, fence.Key, fence.Token) (consumer.Handler[*memfence.Tx], error) {
		return h.Handle, nil
	}
	key := fence.Key{Group: "g", Topic: "orders", Partition: 0}

	fz := netfreeze.New()
	defer fz.Thaw()
	a, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](sink), nil, consumer.PerPartition(factory), consumer.FencedDeadLetters(h.DeadLetter),
		consumer.Kafka(append(fastKafka(brokers), kgo.Dialer(fz.Dial), kgo.RequestTimeoutOverhead(time.Second))...),
		consumer.Logger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	ma := start(t, a)
	select {
	case <-sink.entered: // A passed the fence check for X and its transaction has ended
	case <-time.After(bound(30 * time.Second)):
		t.Fatal("A never reached the dead-letter of the poison record")
	}
	fz.Freeze()

	b, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](sink), nil, consumer.PerPartition(factory), consumer.FencedDeadLetters(h.DeadLetter),
		consumer.Kafka(fastKafka(brokers)...), consumer.Logger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, b)
	waitFor(t, "B takes over, dead-letters X and applies what follows", bound(60*time.Second), func() bool {
		st, _ := store.Load(ctx, key)
		return st.Position >= last
	})
	fz.Thaw()
	close(sink.release)
	select {
	case <-sink.result: // A's dead letter ran in the ended transaction
	case <-time.After(bound(30 * time.Second)):
		t.Fatal("A's held dead letter never ran")
	}
	if err := mb.stop(); err != nil {
		t.Fatalf("B: %v", err)
	}
	_ = ma.stop() // A lost the partition; how its Run ends is not the point

	if !sink.checked.Load() {
		t.Fatal("A's dead-letter transaction never passed the fence check: the interleaving did not happen")
	}
	// Nothing reaches the topic: every dead letter went through the transaction.
	rd, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("orders.dlq"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	var onTopic []string
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		for _, r := range rd.PollFetches(pctx).Records() {
			for _, x := range r.Headers {
				if x.Key == consumer.HeaderDLQToken {
					onTopic = append(onTopic, string(x.Value))
				}
			}
		}
		cancel()
	}
	if len(onTopic) > 0 {
		t.Errorf("dead letters produced to the topic, bypassing the transaction, under tokens %v (A's was %s)", onTopic, sink.held)
	}
	got, ok := store.Get("dlq/" + strconv.FormatInt(poison, 10))
	if !ok {
		t.Fatal("X was never dead-lettered")
	}
	if string(got) == sink.held.String() {
		t.Fatalf("the zombie A's dead letter (token %s) committed", got)
	}
	// A did try: its DeadLetter ran (after B's), in the ended transaction.
	if toks := h.tokens(); len(toks) < 2 || toks[len(toks)-1] != sink.held {
		t.Errorf("DeadLetter calls under %v: want B's, then A's (%s)", toks, sink.held)
	}
	for i := poison + 1; i <= last; i++ {
		if _, ok := store.Get("v/" + strconv.FormatInt(i, 10)); !ok {
			t.Errorf("offset %d never applied", i)
		}
	}
}

// refusingDL is a dead-letter function whose store can never take the copy.
type refusingDL struct {
	dlHandler
	tried atomic.Int32
}

func (h *refusingDL) DeadLetter(context.Context, *memfence.Tx, *consumer.Batch, *kgo.Record) error {
	h.tried.Add(1)
	return consumer.Permanent(errors.New("the copy is larger than the outbox takes"))
}

// A dead-letter copy the handler refuses for good stops the partition loudly (an ERROR naming
// the record), once: the record is neither skipped nor retried for ever, and nothing reaches
// the dead-letter topic.
func TestDeadLetterRefusedForGoodStopsThePartition(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders", "orders.dlq"))
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("ok")}, &kgo.Record{Value: []byte("poison")}, &kgo.Record{Value: []byte("ok")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	store := newStore(t)
	h := &refusingDL{}
	var logs syncBuffer
	c, err := consumer.New("g", []string{"orders"}, store,
		h.Handle, consumer.FencedDeadLetters(h.DeadLetter),
		consumer.Kafka(fastKafka(brokers)...), consumer.Logger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	m := start(t, c)
	waitFor(t, "the ERROR naming the poison record", bound(30*time.Second), func() bool {
		return strings.Contains(logs.String(), "level=ERROR msg=\"the handler refused the dead-letter copy for good")
	})
	time.Sleep(300 * time.Millisecond) // a retry or a skip, had one started, would land meanwhile
	if err := m.stop(); err != nil {
		t.Fatal(err)
	}
	if n := h.tried.Load(); n != 1 {
		t.Errorf("DeadLetter called %d times, want once", n)
	}
	if st, _ := store.Load(ctx, fence.Key{Group: "g", Topic: "orders", Partition: 0}); st.Position != 0 {
		t.Errorf("the fence moved to %d, want 0: the poison record (offset 1) was skipped", st.Position)
	}
	if !strings.Contains(logs.String(), "offset=1") {
		t.Errorf("the ERROR does not name offset 1:\n%s", logs.String())
	}
}
