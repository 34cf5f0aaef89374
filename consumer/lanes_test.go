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

// laneChecks is what the lane tests observe of Prepare, over every handler a factory built:
// per key, no two Prepare calls at once and, within one handler (one partition's ownership),
// sequence numbers one after another; and the highest number of Prepare calls seen at once.
type laneChecks struct {
	mu         sync.Mutex
	violations []string
	running    map[string]int
	now, peak  int
	calls      int
}

func (c *laneChecks) violate(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.violations = append(c.violations, fmt.Sprintf(format, args...))
}

func (c *laneChecks) Violations() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.violations...)
}

func (c *laneChecks) Peak() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.peak
}

func (c *laneChecks) Calls() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

// enter and leave bracket one Prepare call of key; last is the handler's per-key memory.
func (c *laneChecks) enter(key string, seq int, last map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	if c.running == nil {
		c.running = map[string]int{}
	}
	if c.running[key]++; c.running[key] > 1 {
		c.violations = append(c.violations, fmt.Sprintf("key %s: two Prepare calls at once", key))
	}
	if p, ok := last[key]; ok && seq != p+1 {
		c.violations = append(c.violations, fmt.Sprintf("key %s: Prepare of seq %d after %d", key, seq, p))
	}
	last[key] = seq
	c.now++
	c.peak = max(c.peak, c.now)
}

func (c *laneChecks) leave(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.running[key]--
	c.now--
}

// laneFolder is the folder with a first stage: Prepare parses the record's sequence number
// (after hook, the simulated remote call) and Handle folds b.Prepared, checking it against the
// records, so a result given to the wrong record breaks the fold.
type laneFolder struct {
	*folder
	st     *stages[*memfence.Tx, *laneHandler[*memfence.Tx]]
	checks laneChecks
	hook   func(ctx context.Context, r *kgo.Record) error
}

// laneHandler adds a checked first stage to any handler: see laneFolder.
type laneHandler[Tx any] struct {
	consumer.Handler[Tx]
	checks *laneChecks
	hook   func(ctx context.Context, r *kgo.Record) error
	mu     sync.Mutex // Prepare runs on several lanes; last is shared between them
	last   map[string]int
}

func withPrepare[Tx any](h consumer.Handler[Tx], checks *laneChecks, hook func(context.Context, *kgo.Record) error) *laneHandler[Tx] {
	return &laneHandler[Tx]{Handler: h, checks: checks, hook: hook, last: map[string]int{}}
}

func (f *laneFolder) factory(ctx context.Context, k fence.Key, t fence.Token) (*laneHandler[*memfence.Tx], error) {
	h, err := f.folder.factory(ctx, k, t)
	if err != nil {
		return nil, err
	}
	return withPrepare(h, &f.checks, f.hook), nil
}

func (h *laneHandler[Tx]) Prepare(ctx context.Context, r *kgo.Record) (any, error) {
	key := string(r.Key)
	seq, err := strconv.Atoi(string(r.Value))
	if err != nil {
		return nil, consumer.Permanent(err)
	}
	h.mu.Lock()
	h.checks.enter(key, seq, h.last)
	h.mu.Unlock()
	defer h.checks.leave(key)
	if h.hook != nil {
		if err := h.hook(ctx, r); err != nil {
			// A refused record is prepared again: forget it, so the retry is in order.
			h.mu.Lock()
			h.last[key] = seq - 1
			h.mu.Unlock()
			return nil, err
		}
	}
	return seq, nil
}

func (h *laneHandler[Tx]) Handle(ctx context.Context, tx Tx, b *consumer.Batch) error {
	if len(b.Prepared) != len(b.Records) {
		h.checks.violate("batch of %d records with %d prepared results", len(b.Records), len(b.Prepared))
	}
	for i, r := range b.Records {
		if i < len(b.Prepared) && strconv.Itoa(asInt(b.Prepared[i])) != string(r.Value) {
			h.checks.violate("offset %d: prepared %v for value %s", r.Offset, b.Prepared[i], r.Value)
		}
	}
	return h.Handler(ctx, tx, b)
}

func asInt(v any) int { n, _ := v.(int); return n }

func newLaneFolder() *laneFolder {
	f := &laneFolder{folder: newFolder()}
	f.st = newStages(f.factory)
	return f
}

// Records of one key are prepared one at a time, in order, while different keys are prepared
// at once; every record is applied exactly once, with its own prepared result.
func TestLanesKeepPerKeyOrder(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(3, "orders"))
	const keys, n = 30, 20
	produce(t, brokers, "orders", keys, n)
	s := newStore(t)
	f := newLaneFolder()
	f.hook = func(ctx context.Context, r *kgo.Record) error {
		time.Sleep(time.Millisecond) // the remote call
		return nil
	}
	c, err := consumer.New("g", []string{"orders"}, s, nil, f.st.perPartition(), consumer.Kafka(fastKafka(brokers)...),
		consumer.Logger(quiet), f.st.lanes(8))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	waitFor(t, "all records applied", 60*time.Second, allApplied(s, keys, n))
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	checkFold(t, s, keys, n)
	if v := append(f.Violations(), f.checks.Violations()...); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
	if p := f.checks.Peak(); p < 2 {
		t.Fatalf("at most %d Prepare call at once: the lanes never ran in parallel", p)
	}
	t.Logf("%d Prepare calls, at most %d at once", f.checks.Calls(), f.checks.Peak())
}

// The writer applies only the contiguous prefix of prepared records: while the partition's
// first record is still in its lane, records of other keys after it are prepared but nothing
// is applied and the sink's position does not move (the mutant LanesAdvancePastGap applies
// them, and the held record is then skipped as already applied: lost).
func TestLanesNeverAdvancePastARecordInALane(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	const keys, n = 4, 5
	produce(t, brokers, "orders", keys, n)
	s := newStore(t)
	f := newLaneFolder()
	release := make(chan struct{})
	var others atomic.Int64
	f.hook = func(ctx context.Context, r *kgo.Record) error {
		if r.Offset != 0 {
			others.Add(1)
			return nil
		}
		select { // the first record's remote call is slow
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	rs := &applyRecorder{Sink: s}
	c, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](rs), nil, f.st.perPartition(), consumer.Kafka(fastKafka(brokers)...),
		consumer.Logger(quiet), f.st.lanes(4))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	// The other three keys' records (15) are on other lanes; the first key's later ones wait
	// behind offset 0 on its lane.
	waitFor(t, "the other keys' records prepared", bound(30*time.Second), func() bool { return others.Load() >= (keys-1)*n })
	time.Sleep(200 * time.Millisecond) // give a wrong writer the time to apply them
	key := fence.Key{Group: "g", Topic: "orders", Partition: 0}
	st, err := s.Load(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if st.Position != fence.NoPosition || rs.calls.Load() != 0 {
		close(release)
		// Attempts count too: a store that refused the batch must not be what saves us.
		t.Fatalf("sink position %d, %d writes attempted, while offset 0 is still in its lane", st.Position, rs.calls.Load())
	}
	close(release)
	waitFor(t, "all records applied", bound(30*time.Second), allApplied(s, keys, n))
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	checkFold(t, s, keys, n)
	if v := append(f.Violations(), f.checks.Violations()...); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
}

// applyRecorder counts the writes attempted through it.
type applyRecorder struct {
	fence.Sink[*memfence.Tx]
	calls atomic.Int64
}

func (a *applyRecorder) Apply(ctx context.Context, k fence.Key, t fence.Token, first, last int64, fn func(context.Context, *memfence.Tx) error) error {
	a.calls.Add(1)
	return a.Sink.Apply(ctx, k, t, first, last, fn)
}

// A revoke in the middle of the lanes (here: the member shuts down) cancels every lane's
// Prepare, applies nothing past the contiguous prefix, and returns only after every lane has
// returned; the next owner resumes at the sink's position and applies the rest exactly once.
func TestLanesRevokeCancelsAndWaits(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	const keys, n = 6, 10
	produce(t, brokers, "orders", keys, n)
	s := newStore(t)
	f := newLaneFolder()
	var held atomic.Int64 // the offset held in its lane
	held.Store(-1)
	entered := make(chan struct{})
	var cancelled, returned atomic.Bool
	abort := make(chan struct{})
	f.hook = func(ctx context.Context, r *kgo.Record) error {
		if string(r.Key) != "k2" || string(r.Value) != "4" || !held.CompareAndSwap(-1, r.Offset) {
			return nil
		}
		close(entered)
		select { // the remote call, cancelled by the revoke
		case <-ctx.Done():
		case <-abort: // the test failed: let the member stop
			return errors.New("aborted")
		}
		cancelled.Store(true)
		time.Sleep(100 * time.Millisecond) // and slow to return: the revoke must wait for it
		returned.Store(true)
		return ctx.Err()
	}
	a, err := consumer.New("g", []string{"orders"}, s, nil, f.st.perPartition(), consumer.Kafka(fastKafka(brokers)...),
		consumer.Logger(quiet), f.st.lanes(4))
	if err != nil {
		t.Fatal(err)
	}
	ma := start(t, a)
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the held record never reached its lane")
	}
	time.Sleep(100 * time.Millisecond) // the other lanes go on meanwhile
	stopped := make(chan error, 1)
	go func() { stopped <- ma.stop() }()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		close(abort)
		t.Fatal("A did not stop: its lanes were not cancelled")
	}
	if !cancelled.Load() || !returned.Load() {
		t.Fatalf("A returned before its lane did (cancelled %v, returned %v)", cancelled.Load(), returned.Load())
	}
	key := fence.Key{Group: "g", Topic: "orders", Partition: 0}
	st, err := s.Load(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if st.Position >= held.Load() {
		t.Fatalf("sink position %d at or past offset %d, which never completed", st.Position, held.Load())
	}
	t.Logf("A stopped at position %d, offset %d held", st.Position, held.Load())

	b, err := consumer.New("g", []string{"orders"}, s, nil, f.st.perPartition(), consumer.Kafka(fastKafka(brokers)...),
		consumer.Logger(quiet), f.st.lanes(4))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, b)
	waitFor(t, "B applies the rest", 30*time.Second, allApplied(s, keys, n))
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	checkFold(t, s, keys, n)
	if v := append(f.Violations(), f.checks.Violations()...); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
}

// A zombie's lanes cannot write: member A pauses (network frozen) with its writer's
// transaction on its way while its lanes have prepared more; B takes over and applies
// everything; A's write is refused as stale when it resumes. Nothing lost, nothing doubled.
func TestLanesZombieWriteRefused(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	const keys, n1, n = 4, 5, 20
	store := newStore(t)
	fz := netfreeze.New()
	f := newLaneFolder()
	gate := newGatedSink(store)
	mA := newMeter()
	a, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](gate), nil, f.st.perPartition(),
		consumer.Kafka(append(fastKafka(brokers), kgo.Dialer(fz.Dial), kgo.RequestTimeoutOverhead(time.Second))...),
		consumer.Logger(quiet), consumer.MeterProvider(mA), f.st.lanes(4))
	if err != nil {
		t.Fatal(err)
	}
	ma := start(t, a)
	produceSeq(t, brokers, "orders", keys, 1, n1)
	waitFor(t, "A applies the first records", 30*time.Second, allApplied(store, keys, n1))
	gate.arm()
	produceSeq(t, brokers, "orders", keys, n1+1, n1+3)
	<-gate.entered // A's writer is between deciding to write and writing
	fz.Freeze()
	defer fz.Thaw()

	b, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](store), nil, f.st.perPartition(),
		consumer.Kafka(fastKafka(brokers)...), consumer.Logger(quiet), f.st.lanes(4))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, b)
	produceSeq(t, brokers, "orders", keys, n1+4, n)
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
	if v := append(f.Violations(), f.checks.Violations()...); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
}

// Prepare's failures keep their meaning under lanes: a transient one is retried on the
// record's lane (the key's later records wait behind it), a permanent one dead-letters the
// record in its place while the records around it are applied.
func TestLanesPrepareRetriesAndDeadLetters(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders", "orders.dlq"))
	const keys, n = 3, 6
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
	f := newLaneFolder()
	var failures atomic.Int64
	f.hook = func(ctx context.Context, r *kgo.Record) error {
		if string(r.Key) == "k1" && string(r.Value) == "2" && failures.Add(1) <= 2 {
			return errTransient
		}
		return nil
	}
	m := newMeter()
	c, err := consumer.New("g", []string{"orders"}, store, nil, f.st.perPartition(), consumer.Kafka(fastKafka(brokers)...),
		consumer.Logger(quiet), consumer.MeterProvider(m), f.st.lanes(4),
		consumer.RetryBackoff(10*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	waitFor(t, "all good records applied", 30*time.Second, allApplied(store, keys, n))
	waitFor(t, "the poison record dead-lettered", 30*time.Second, func() bool {
		return m.sum(t, "baton.consumer.records.dead_lettered") == 1
	})
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	checkFold(t, store, keys, n)
	if v := append(f.Violations(), f.checks.Violations()...); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
	if got := failures.Load(); got < 3 {
		t.Fatalf("the failing record was prepared %d times, want 3 (two transient failures)", got)
	}
	st, err := store.Load(context.Background(), fence.Key{Group: "g", Topic: "orders", Partition: 0})
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(keys*n + 1 - 1); st.Position != want {
		t.Fatalf("sink position %d, want %d (every record, the poison one included)", st.Position, want)
	}
}

// Lanes is validated by New.
func TestLanesOptionValidated(t *testing.T) {
	s := newStore(t)
	brokers := consumer.Kafka(kgo.SeedBrokers("127.0.0.1:1"))
	lf := newLaneFolder()
	for _, n := range []int{0, -1, 257} {
		if _, err := consumer.New("g", []string{"t"}, s, nil, lf.st.perPartition(), brokers, lf.st.lanes(n)); !errors.Is(err, consumer.ErrInvalidOption) {
			t.Errorf("Lanes(%d): %v, want ErrInvalidOption", n, err)
		}
	}
	for _, n := range []int{1, 16, 256} {
		if _, err := consumer.New("g", []string{"t"}, s, nil, lf.st.perPartition(), brokers, lf.st.lanes(n)); err != nil {
			t.Errorf("Lanes(%d): %v", n, err)
		}
	}
	if _, err := consumer.New("g", []string{"t"}, s, nil, lf.st.perPartition(), brokers, consumer.Lanes(4, nil)); !errors.Is(err, consumer.ErrInvalidOption) {
		t.Errorf("Lanes with a nil prepare function: %v, want ErrInvalidOption", err)
	}
}
