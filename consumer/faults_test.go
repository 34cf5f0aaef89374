package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
	"github.com/batonhq/baton/internal/testkit/netfreeze"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// gatedSink holds one Apply (the first after arm) at a gate, as if the process paused
// between deciding to write and writing; the held write goes on to the real store after
// release, whatever happened to its context meanwhile (a paused process does not see its
// cancellation either).
type gatedSink struct {
	fence.Sink[*memfence.Tx]
	mu      sync.Mutex
	armed   bool
	entered chan struct{}
	release chan struct{}
	result  chan error
}

func newGatedSink(s fence.Sink[*memfence.Tx]) *gatedSink {
	return &gatedSink{Sink: s, entered: make(chan struct{}), release: make(chan struct{}), result: make(chan error, 1)}
}

func (g *gatedSink) arm() { g.mu.Lock(); g.armed = true; g.mu.Unlock() }

func (g *gatedSink) Apply(ctx context.Context, k fence.Key, t fence.Token, first, pos int64, fn func(context.Context, *memfence.Tx) error) error {
	g.mu.Lock()
	held := g.armed
	g.armed = false
	g.mu.Unlock()
	if !held {
		return g.Sink.Apply(ctx, k, t, first, pos, fn)
	}
	close(g.entered)
	<-g.release
	err := g.Sink.Apply(context.WithoutCancel(ctx), k, t, first, pos, fn)
	g.result <- err
	return err
}

// A zombie: member A pauses (network frozen) with a write on its way; B takes the partition
// over and applies everything. When A resumes, its write reaches the sink and is refused as
// stale; the test proves the write was attempted, and nothing is lost or applied twice.
func TestZombieWriteRefused(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	const keys, n1, n = 3, 5, 20
	store := newStore(t)
	fz := netfreeze.New()
	f := newFolder()
	gate := newGatedSink(store)
	mA := newMeter()
	a, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](gate), nil, consumer.PerPartition(f.factory),
		consumer.Kafka(append(fastKafka(brokers), kgo.Dialer(fz.Dial), kgo.RequestTimeoutOverhead(time.Second))...),
		consumer.Logger(quiet), consumer.MeterProvider(mA))
	if err != nil {
		t.Fatal(err)
	}
	ma := start(t, a)
	produceSeq(t, brokers, "orders", keys, 1, n1)
	waitFor(t, "A applies the first records", 30*time.Second, allApplied(store, keys, n1))
	gate.arm()
	produceSeq(t, brokers, "orders", keys, n1+1, n1+1)
	<-gate.entered // A's worker is now between deciding to write and writing
	fz.Freeze()
	defer fz.Thaw()

	mB := newMeter()
	b, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](store), nil, consumer.PerPartition(f.factory),
		consumer.Kafka(fastKafka(brokers)...), consumer.Logger(quiet), consumer.MeterProvider(mB))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, b)
	produceSeq(t, brokers, "orders", keys, n1+2, n)
	waitFor(t, "B takes over and applies everything", 60*time.Second, allApplied(store, keys, n))

	close(gate.release)
	if err := <-gate.result; !errors.Is(err, fence.ErrStale) {
		t.Fatalf("the zombie's write returned %v, want a stale refusal", err)
	}
	fz.Thaw()
	waitFor(t, "A counts the refusal", 30*time.Second, func() bool { return mA.sum(t, "baton.consumer.stale_refusals") >= 1 })
	if err := ma.stop(); err != nil {
		t.Fatalf("A: %v", err)
	}
	if err := mb.stop(); err != nil {
		t.Fatalf("B: %v", err)
	}
	checkFold(t, store, keys, n)
	if v := f.Violations(); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
}

// A poison record is dead-lettered with its provenance; the records around it apply and the
// partition keeps going.
func TestPoisonRecordDeadLettered(t *testing.T) {
	for _, named := range []bool{true, false} {
		t.Run("named="+strconv.FormatBool(named), func(t *testing.T) {
			brokers := fakeKafka(t, kfake.SeedTopics(1, "orders", "orders.dlq"))
			const keys, n = 2, 6
			produceSeq(t, brokers, "orders", keys, 1, 3)
			cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: "orders", Key: []byte("x"), Value: []byte("poison")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
			produceSeq(t, brokers, "orders", keys, 4, n)
			store := newStore(t)
			f := newFolder()
			f.block = func(_ context.Context, b *consumer.Batch) error {
				for _, r := range b.Records {
					if string(r.Value) == "poison" {
						if named {
							return b.Fail(r, errors.New("cannot decode"))
						}
						return consumer.Permanent(errors.New("cannot decode"))
					}
				}
				return nil
			}
			m := newMeter()
			c, err := consumer.New("g", []string{"orders"}, store, nil, consumer.PerPartition(f.factory), consumer.Kafka(fastKafka(brokers)...),
				consumer.Logger(quiet), consumer.MeterProvider(m))
			if err != nil {
				t.Fatal(err)
			}
			mb := start(t, c)
			waitFor(t, "all good records applied", 30*time.Second, allApplied(store, keys, n))
			if err := mb.stop(); err != nil {
				t.Fatal(err)
			}
			checkFold(t, store, keys, n)
			if v := f.Violations(); len(v) > 0 {
				t.Fatalf("violations: %v", v)
			}
			if got := m.sum(t, "baton.consumer.records.dead_lettered"); got != 1 {
				t.Errorf("dead-lettered %d, want 1", got)
			}
			rd, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("orders.dlq"),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			if err != nil {
				t.Fatal(err)
			}
			defer rd.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			fs := rd.PollFetches(ctx)
			recs := fs.Records()
			if len(recs) != 1 || string(recs[0].Value) != "poison" {
				t.Fatalf("dead-letter topic holds %d records (%v), want the poison one", len(recs), fs.Errors())
			}
			h := map[string]string{}
			for _, x := range recs[0].Headers {
				h[x.Key] = string(x.Value)
			}
			if h[consumer.HeaderDLQTopic] != "orders" || h[consumer.HeaderDLQPartition] != "0" ||
				h[consumer.HeaderDLQOffset] != "6" || h[consumer.HeaderDLQReason] == "" || h[consumer.HeaderDLQToken] == "" {
				t.Errorf("dead-letter headers %v", h)
			}
		})
	}
}

// Deleting and recreating the group sends the generation backwards: the member proves with
// the coordinator that it is current, the regression is reported and recovered through
// Sink.Recover (recorded), and an old-era token is refused afterwards.
func TestRegressionRecovered(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	const keys, n = 2, 5
	produce(t, brokers, "orders", keys, n)
	store := newStore(t)
	ctx := context.Background()
	key := fence.Key{Group: "g", Topic: "orders", Partition: 0}
	old := fence.Token{Era: 0, Epoch: 1000} // the previous incarnation of the group got far
	if _, err := store.Claim(ctx, key, old, "test"); err != nil {
		t.Fatal(err)
	}
	m := newMeter()
	f := newFolder()
	c, err := consumer.New("g", []string{"orders"}, store, nil, consumer.PerPartition(f.factory), consumer.Kafka(fastKafka(brokers)...),
		consumer.Logger(quiet), consumer.MeterProvider(m))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	waitFor(t, "records applied after recovery", 30*time.Second, allApplied(store, keys, n))
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	checkFold(t, store, keys, n)
	if got := m.sum(t, "baton.consumer.regressions"); got != 1 {
		t.Errorf("regressions %d, want 1", got)
	}
	if got := m.sum(t, "baton.consumer.claims.stale"); got < 1 {
		t.Errorf("stale claims counted %d, want at least 1", got)
	}
	recs, err := store.Recoveries(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].From != old || recs[0].To.Era != 1 {
		t.Fatalf("recoveries %+v, want one from %s to era 1", recs, old)
	}
	if _, err := store.Claim(ctx, key, fence.Token{Era: 0, Epoch: 5000}, "test"); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("old-era claim: %v, want stale", err)
	}
}

// With RecoverRegressions off, a regression is reported and the partition is left alone:
// nothing applied, nothing recovered.
// A recreated group whose generation comes back to exactly the stored epoch presents an equal
// token, which a zombie of the old incarnation also holds. The sink refuses an equal token held
// by another claimant (no Load-and-compare in the consumer); the member
// proves it is current and moves to a new era, after which the zombie is refused. (Mutant
// EqualTokenOtherClaimantAccepted: taking the equal token over skips the recovery.)
func TestRegressionAtEqualGeneration(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	const keys, n = 2, 5
	produce(t, brokers, "orders", keys, n)
	store := newStore(t)
	ctx := context.Background()
	key := fence.Key{Group: "g", Topic: "orders", Partition: 0}
	old := fence.Token{Era: 0, Epoch: 1} // the old incarnation's single member, at generation 1
	if _, err := store.Claim(ctx, key, old, "test"); err != nil {
		t.Fatal(err)
	}
	m := newMeter()
	f := newFolder()
	c, err := consumer.New("g", []string{"orders"}, store, nil, consumer.PerPartition(f.factory), consumer.Kafka(fastKafka(brokers)...),
		consumer.Logger(quiet), consumer.MeterProvider(m))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	waitFor(t, "records applied after recovery", 30*time.Second, allApplied(store, keys, n))
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	checkFold(t, store, keys, n)
	recs, err := store.Recoveries(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].From != old || recs[0].To != (fence.Token{Era: 1, Epoch: 1}) {
		t.Fatalf("recoveries %+v, want one from %s to 1.1 (the new member joined at generation 1)", recs, old)
	}
	// The old incarnation's zombie, holding the equal token, is now refused.
	err = store.Apply(ctx, key, old, 1<<40, 1<<40, func(context.Context, *memfence.Tx) error { return nil })
	if !errors.Is(err, fence.ErrStale) {
		t.Fatalf("zombie of the old incarnation with token %s: %v, want stale", old, err)
	}
}

func TestRegressionNotRecoveredWhenOff(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	produce(t, brokers, "orders", 2, 5)
	store := newStore(t)
	ctx := context.Background()
	key := fence.Key{Group: "g", Topic: "orders", Partition: 0}
	old := fence.Token{Era: 0, Epoch: 1000}
	if _, err := store.Claim(ctx, key, old, "test"); err != nil {
		t.Fatal(err)
	}
	m := newMeter()
	f := newFolder()
	c, err := consumer.New("g", []string{"orders"}, store, nil, consumer.PerPartition(f.factory), consumer.Kafka(fastKafka(brokers)...),
		consumer.Logger(quiet), consumer.MeterProvider(m), consumer.RecoverRegressions(false))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	waitFor(t, "the regression reported", 30*time.Second, func() bool { return m.sum(t, "baton.consumer.regressions") >= 1 })
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	if got := m.sum(t, "baton.consumer.records.applied"); got != 0 {
		t.Errorf("applied %d records despite an unrecovered regression", got)
	}
	if recs, _ := store.Recoveries(ctx, key); len(recs) != 0 {
		t.Errorf("recovered %+v with RecoverRegressions off", recs)
	}
	if st, _ := store.Load(ctx, key); st.Token != old {
		t.Errorf("fence moved to %s", st.Token)
	}
}

// A partition paused by backpressure that is revoked and later assigned back fetches again:
// the pause does not outlive the assignment.
func TestBackpressurePauseClearedAcrossRebalance(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(2, "orders"))
	const keys, n = 8, 30
	produceSeq(t, brokers, "orders", keys, 1, 1)
	store := newStore(t)
	f := newFolder()
	hold := make(chan struct{})
	var once sync.Once
	var blocked sync.WaitGroup
	blocked.Add(2)
	seen := map[fence.Key]bool{}
	var mu sync.Mutex
	f.block = func(ctx context.Context, b *consumer.Batch) error {
		mu.Lock()
		if !seen[b.Key] {
			seen[b.Key] = true
			blocked.Done()
		}
		mu.Unlock()
		select {
		case <-hold:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	newMember := func() *consumer.Consumer[*memfence.Tx] {
		c, err := consumer.New("g", []string{"orders"}, store, nil, consumer.PerPartition(f.factory), consumer.Kafka(fastKafka(brokers)...),
			consumer.Logger(quiet), consumer.MaxInflightPerPartition(50), consumer.MaxInflight(1000))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a := start(t, newMember())
	blocked.Wait() // both partitions are in A's handler with their first record
	// More records than the per-partition bound queue behind the blocked batch: both
	// partitions get paused with records still queued when they are revoked.
	produceSeq(t, brokers, "orders", keys, 2, n)
	time.Sleep(500 * time.Millisecond) // let them be fetched (no assertion rests on it)
	b := start(t, newMember())
	time.Sleep(time.Second) // let the rebalance move one partition to B (no assertion rests on it)
	if err := b.stop(); err != nil {
		t.Fatal(err)
	}
	once.Do(func() { close(hold) })
	waitFor(t, "all records applied by A", 30*time.Second, allApplied(store, keys, n))
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	checkFold(t, store, keys, n)
}

// A handler error that happens to wrap a fence sentinel (its own idempotency layer, an
// append under another key's fence) is the handler's failure, not the sink's verdict on the
// batch: it is retried like any transient error. Read as the sink's ErrDuplicate it would make
// the worker skip a batch the sink never applied (the mutant HandlerErrorReadAsVerdict).
func TestHandlerErrorWrappingAFenceSentinelIsRetried(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	const keys, n = 2, 5
	produceSeq(t, brokers, "orders", keys, 1, n)
	store := newStore(t)
	f := newFolder()
	var failed atomic.Int32
	f.block = func(_ context.Context, b *consumer.Batch) error {
		if failed.Add(1) == 1 {
			return fmt.Errorf("my idempotency layer: %w", fence.ErrDuplicate)
		}
		return nil
	}
	m := newMeter()
	c, err := consumer.New("g", []string{"orders"}, store, nil, consumer.PerPartition(f.factory), consumer.Kafka(fastKafka(brokers)...),
		consumer.Logger(quiet), consumer.MeterProvider(m), consumer.RetryBackoff(10*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	applied := allApplied(store, keys, n)
	waitFor(t, "every record applied after the handler's failure (or a batch skipped)", 15*time.Second, func() bool {
		return applied() || m.sum(t, "baton.consumer.records.duplicates_skipped") > 0
	})
	if d := m.sum(t, "baton.consumer.records.duplicates_skipped"); d > 0 {
		t.Fatalf("%d records skipped as already applied: the handler's error was read as the sink's verdict", d)
	}
	waitFor(t, "every record applied after the handler's failure", 15*time.Second, applied)
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	if failed.Load() < 2 {
		t.Fatalf("the handler ran %d times: the failure never happened or was never retried", failed.Load())
	}
	checkFold(t, store, keys, n)
	if v := f.Violations(); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
}

// An idle owner re-claims when its relay is refused (the model's TestModelRelayGap): an owner with nothing left to apply learns
// that another claim took its fence (a member of an old group incarnation at a higher
// generation, which then fails its proof) only through its relay, whose Flush is refused as
// stale. The refusal must re-run the claim decision at once (the owner proves it is current and
// recovers into a new era), not be logged and retried until the partition's next record (the
// mutant RelayStaleNotReclaimed).
func TestIdleOwnerReclaimsWhenItsRelayIsRefused(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	const keys, n = 2, 3
	produceSeq(t, brokers, "orders", keys, 1, n)
	store := newStore(t)
	f := newFolder()
	var mu sync.Mutex
	var relayed []fence.Token // tokens under which the hook's fenced "flush" succeeded
	hook := func(ctx context.Context, k fence.Key, tok fence.Token) error {
		st, err := store.Load(ctx, k)
		if err != nil {
			return err
		}
		if st.Token != tok {
			return &fence.StaleError{Key: k, Stored: st.Token, Presented: tok}
		}
		mu.Lock()
		relayed = append(relayed, tok)
		mu.Unlock()
		return nil
	}
	c, err := consumer.New("g", []string{"orders"}, store, nil, consumer.PerPartition(f.factory), consumer.Kafka(fastKafka(brokers)...),
		consumer.Logger(quiet), consumer.AfterCommit(hook, 50*time.Millisecond),
		consumer.RetryBackoff(10*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	waitFor(t, "every record applied", 15*time.Second, allApplied(store, keys, n))
	k := fence.Key{Group: "g", Topic: "orders", Partition: 0}
	st, err := store.Load(context.Background(), k)
	if err != nil {
		t.Fatal(err)
	}
	// The zombie's late claim at a higher epoch of the same era; it never writes.
	zombie := fence.Token{Era: st.Token.Era, Epoch: st.Token.Epoch + 100}
	if _, err := store.Claim(context.Background(), k, zombie, "zombie"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the idle owner re-claims into a new era and relays again", 15*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(relayed) > 0 && relayed[len(relayed)-1].Era > zombie.Era
	})
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	checkFold(t, store, keys, n)
}
