package consumer_test

// The claim protocol's interleavings (a zombie's claim and proof, a recovery's conflict, a
// retained partition, the position filter, the token's generation, the dead letter, the
// revoke), guards of several mutants (internal/testkit/mutants). Each test names the
// interleaving it closes.

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// fakeCluster is fakeKafka that also returns the cluster, for tests that control requests.
func fakeCluster(t *testing.T, opts ...kfake.Opt) (*kfake.Cluster, []string) {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1),
		kfake.BrokerConfigs(map[string]string{"group.min.session.timeout.ms": "500"})}, opts...)...)
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c, c.ListenAddrs()
}

// bound is a liveness bound for waitFor, capped by $BATON_TEST_BOUND (a duration) when set:
// the mutant runner (internal/testkit/cmd/mutants) sets it, as there the tests are expected to
// fail.
func bound(d time.Duration) time.Duration {
	if c, err := time.ParseDuration(os.Getenv("BATON_TEST_BOUND")); err == nil && c > 0 {
		return min(d, c)
	}
	return d
}

// claimGate holds every Claim while armed (until released or the caller's ctx ends), as if the
// worker paused between its assignment and its claim.
type claimGate struct {
	fence.Sink[*memfence.Tx]
	armed   atomic.Bool
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func newClaimGate(s fence.Sink[*memfence.Tx]) *claimGate {
	g := &claimGate{Sink: s, entered: make(chan struct{}), release: make(chan struct{})}
	g.armed.Store(true)
	return g
}

func (g *claimGate) Claim(ctx context.Context, k fence.Key, t fence.Token, c string) (fence.State, error) {
	if g.armed.Load() {
		g.once.Do(func() { close(g.entered) })
		select {
		case <-g.release:
		case <-ctx.Done():
			return fence.State{}, ctx.Err()
		}
	}
	return g.Sink.Claim(ctx, k, t, c)
}

func (g *claimGate) open() { g.armed.Store(false); close(g.release) }

// A zombie's claim never recovers (mutants BlindHeartbeatProof, StaleClaimIsRegression). Interleaving: Z is
// assigned p at generation 1 and pauses before its claim. The coordinator answers Z's
// heartbeats blindly (as Kafka's does while it loads a group after a coordinator move), so Z
// never learns that it was dropped; N joins, is assigned p at a later generation, claims and
// applies. Z resumes: its claim is refused as stale, and it must ask the coordinator with a
// proof that cannot be answered blindly. While the coordinator is still loading, the proof
// cannot tell (retried); afterwards it refuses Z. Z must never raise the era, and N is never
// refused.
func TestStaleClaimOfZombieNeverRecovers(t *testing.T) {
	c, brokers := fakeCluster(t, kfake.SeedTopics(1, "orders"))
	const keys, n1, n = 2, 4, 8
	produceSeq(t, brokers, "orders", keys, 1, n1)
	store := newStore(t)
	key := fence.Key{Group: "g", Topic: "orders", Partition: 0}

	var (
		mu      sync.Mutex
		zID     string
		blind   atomic.Bool
		loading atomic.Bool
		loaded  atomic.Int32 // proof requests answered "loading"
	)
	c.ControlKey(int16(kmsg.Heartbeat), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		hb := req.(*kmsg.HeartbeatRequest)
		mu.Lock()
		if zID == "" {
			zID = hb.MemberID
		}
		z := zID
		mu.Unlock()
		if blind.Load() && hb.MemberID == z {
			return hb.ResponseKind(), nil, true // NONE, whatever the member and generation
		}
		return nil, nil, false
	})
	for _, k := range []int16{int16(kmsg.OffsetCommit), int16(kmsg.DescribeGroups)} {
		c.ControlKey(k, func(req kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			if !loading.Load() {
				return nil, nil, false
			}
			loaded.Add(1)
			switch r := req.(type) {
			case *kmsg.OffsetCommitRequest:
				resp := r.ResponseKind().(*kmsg.OffsetCommitResponse)
				for _, rt := range r.Topics {
					st := kmsg.NewOffsetCommitResponseTopic()
					st.Topic, st.TopicID = rt.Topic, rt.TopicID
					for _, rp := range rt.Partitions {
						sp := kmsg.NewOffsetCommitResponseTopicPartition()
						sp.Partition, sp.ErrorCode = rp.Partition, kerr.CoordinatorLoadInProgress.Code
						st.Partitions = append(st.Partitions, sp)
					}
					resp.Topics = append(resp.Topics, st)
				}
				return resp, nil, true
			case *kmsg.DescribeGroupsRequest:
				resp := r.ResponseKind().(*kmsg.DescribeGroupsResponse)
				for _, g := range r.Groups {
					sg := kmsg.NewDescribeGroupsResponseGroup()
					sg.Group, sg.ErrorCode = g, kerr.CoordinatorLoadInProgress.Code
					resp.Groups = append(resp.Groups, sg)
				}
				return resp, nil, true
			}
			return nil, nil, false
		})
	}

	f := newFolder()
	gate := newClaimGate(store)
	mZ := newMeter()
	z, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](gate), nil, consumer.PerPartition(f.factory),
		consumer.Kafka(fastKafka(brokers)...), consumer.Logger(quiet), consumer.MeterProvider(mZ),
		consumer.ClaimWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	mz := start(t, z)
	<-gate.entered
	waitFor(t, "Z heartbeats", 10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return zID != "" })
	blind.Store(true)

	nc, err := consumer.New("g", []string{"orders"}, store, nil, consumer.PerPartition(f.factory), consumer.Kafka(fastKafka(brokers)...),
		consumer.Logger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	mn := start(t, nc)
	waitFor(t, "N takes the partition and applies", bound(60*time.Second), allApplied(store, keys, n1))
	owner, err := store.Load(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}

	loading.Store(true)
	gate.open()
	waitFor(t, "Z asks the loading coordinator", bound(10*time.Second), func() bool { return loaded.Load() > 0 })
	time.Sleep(300 * time.Millisecond) // Z retries meanwhile; no assertion rests on the length
	loading.Store(false)
	// Z gives up, or (its client still believing its generation current, as the blind
	// heartbeats make it) keeps asking: the refusal of a generation its client has not seen
	// move is "cannot tell", retried, never proof. Either way it must not recover.
	retried := mZ.sum(t, "baton.consumer.retries")
	waitFor(t, "Z gives up, recovers or is refused again", bound(20*time.Second), func() bool {
		return mZ.sum(t, "baton.consumer.stale_refusals") >= 1 || mZ.sum(t, "baton.consumer.recoveries") >= 1 ||
			mZ.sum(t, "baton.consumer.retries") >= retried+2
	})

	produceSeq(t, brokers, "orders", keys, n1+1, n)
	waitFor(t, "N applies everything", bound(30*time.Second), allApplied(store, keys, n))
	if recs, _ := store.Recoveries(context.Background(), key); len(recs) != 0 {
		t.Fatalf("a member that was not current raised the era: %+v", recs)
	}
	if st, _ := store.Load(context.Background(), key); st.Token != owner.Token || st.Claimant != owner.Claimant {
		t.Fatalf("fence moved from N's %s (%s) to %s (%s)", owner.Token, owner.Claimant, st.Token, st.Claimant)
	}
	if got := mZ.sum(t, "baton.consumer.regressions"); got != 0 {
		t.Errorf("Z reported %d regressions", got)
	}
	blind.Store(false)
	_ = mz.stop()
	if err := mn.stop(); err != nil {
		t.Fatal(err)
	}
	checkFold(t, store, keys, n)
	if v := f.Violations(); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
}

// A non-current member's era, the owner's side. Interleaving: a member that was not current raised the era
// over the owner's token (what a blind proof allowed). The owner's next write is refused as
// stale; it must ask the coordinator, find itself current, recover and go on, instead of
// stopping the partition for good.
func TestOwnerRefusedAsStaleReclaims(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	const keys, n1, n = 2, 4, 8
	produceSeq(t, brokers, "orders", keys, 1, n1)
	store := newStore(t)
	ctx := context.Background()
	key := fence.Key{Group: "g", Topic: "orders", Partition: 0}
	f := newFolder()
	m := newMeter()
	c, err := consumer.New("g", []string{"orders"}, store, nil, consumer.PerPartition(f.factory), consumer.Kafka(fastKafka(brokers)...),
		consumer.Logger(quiet), consumer.MeterProvider(m))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	waitFor(t, "first records applied", bound(30*time.Second), allApplied(store, keys, n1))
	st, err := store.Load(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Recover(ctx, key, st.Token, 99, "zombie", "test: a member that was not current raised the era"); err != nil {
		t.Fatal(err)
	}
	produceSeq(t, brokers, "orders", keys, n1+1, n)
	waitFor(t, "the owner recovers and applies everything", bound(30*time.Second), allApplied(store, keys, n))
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	checkFold(t, store, keys, n)
	if v := f.Violations(); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
	recs, _ := store.Recoveries(ctx, key)
	if len(recs) != 2 || recs[1].From != (fence.Token{Era: 1, Epoch: 99}) {
		t.Fatalf("recoveries %+v: want the zombie's and then the owner's from 1.99", recs)
	}
}

// lostReply commits the first Recover and then reports a transient error, as a reply lost on
// the network would.
type lostReply struct {
	fence.Sink[*memfence.Tx]
	lost atomic.Bool
}

func (s *lostReply) Recover(ctx context.Context, k fence.Key, expected fence.Token, epoch int64, claimant, reason string) (fence.Token, error) {
	to, err := s.Sink.Recover(ctx, k, expected, epoch, claimant, reason)
	if err == nil && s.lost.CompareAndSwap(false, true) {
		return fence.Token{}, errTransient
	}
	return to, err
}

// A lost Recover reloads (mutant RecoverConflictRetriedSame). Interleaving: a regression is proven
// and Recover commits, but its reply is lost; the retry of the same compare-and-set loses
// (ErrConflict), since the stored token is already the recovered one. The worker must reload
// and decide again (the recovered token is held by its own claimant, so it claims it), not
// retry the same compare-and-set until the partition is revoked.
func TestRecoverConflictReloads(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	const keys, n = 2, 5
	produce(t, brokers, "orders", keys, n)
	store := newStore(t)
	ctx := context.Background()
	key := fence.Key{Group: "g", Topic: "orders", Partition: 0}
	if _, err := store.Claim(ctx, key, fence.Token{Epoch: 1000}, "old"); err != nil {
		t.Fatal(err)
	}
	sink := &lostReply{Sink: store}
	f := newFolder()
	c, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](sink), nil, consumer.PerPartition(f.factory),
		consumer.Kafka(fastKafka(brokers)...), consumer.Logger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	waitFor(t, "records applied after the recovery", bound(30*time.Second), allApplied(store, keys, n))
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	checkFold(t, store, keys, n)
	if !sink.lost.Load() {
		t.Fatal("no Recover reply was lost: the test did not exercise the interleaving")
	}
	if recs, _ := store.Recoveries(ctx, key); len(recs) != 1 {
		t.Fatalf("recoveries %+v, want exactly one", recs)
	}
}

// A partition retained at a later generation. Interleaving: member A is assigned both partitions at generation g and its claims
// outlast ClaimWait (here: held, and refused as an equal token of an old claimant when they
// go through); B joins meanwhile and the cooperative rebalance leaves A one partition q, kept
// at a later generation. Verifying at the assignment's generation gets ILLEGAL_GENERATION; the
// coordinator still confirms q is A's at its current generation, so A must re-derive its
// epoch and claim again, not leave q idle for as long as it keeps it.
func TestRetainedPartitionClaimsAtCurrentGeneration(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(2, "orders"))
	const keys, n = 8, 4
	produce(t, brokers, "orders", keys, n)
	store := newStore(t)
	ctx := context.Background()
	for p := int32(0); p < 2; p++ {
		if _, err := store.Claim(ctx, fence.Key{Group: "g", Topic: "orders", Partition: p}, fence.Token{Epoch: 1}, "old"); err != nil {
			t.Fatal(err)
		}
	}
	f := newFolder()
	gate := newClaimGate(store)
	a, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](gate), nil, consumer.PerPartition(f.factory),
		consumer.Kafka(fastKafka(brokers)...), consumer.Logger(quiet), consumer.ClaimWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ma := start(t, a)
	<-gate.entered
	b, err := consumer.New("g", []string{"orders"}, store, nil, consumer.PerPartition(f.factory), consumer.Kafka(fastKafka(brokers)...),
		consumer.Logger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, b)
	waitFor(t, "B claims its partition", bound(30*time.Second), func() bool {
		for p := int32(0); p < 2; p++ {
			if st, _ := store.Load(ctx, fence.Key{Group: "g", Topic: "orders", Partition: p}); st.Claimant != "old" {
				return true
			}
		}
		return false
	})
	time.Sleep(300 * time.Millisecond) // let the rebalance settle (no assertion rests on it)
	gate.open()
	waitFor(t, "both partitions applied", bound(30*time.Second), allApplied(store, keys, n))
	if err := ma.stop(); err != nil {
		t.Fatal(err)
	}
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	checkFold(t, store, keys, n)
	if v := f.Violations(); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
}

// lowballClaims reports a claimed position lower than the sink's, as if the seek to the sink's
// position had lost a race with a fetch: records at or below the position arrive.
type lowballClaims struct {
	fence.Sink[*memfence.Tx]
	overlaps atomic.Int32
}

func (s *lowballClaims) Apply(ctx context.Context, k fence.Key, t fence.Token, first, last int64, fn func(context.Context, *memfence.Tx) error) error {
	err := s.Sink.Apply(ctx, k, t, first, last, fn)
	if errors.Is(err, fence.ErrOverlap) {
		s.overlaps.Add(1)
	}
	return err
}

func (s *lowballClaims) Claim(ctx context.Context, k fence.Key, t fence.Token, c string) (fence.State, error) {
	st, err := s.Sink.Claim(ctx, k, t, c)
	if err == nil && st.Position >= 3 {
		st.Position -= 3
	}
	return st, err
}

// The position filter (mutant AppliedRecordsNotFiltered). Interleaving: records
// at or below the sink's position reach the worker in a batch that spans the position (the
// seek lost a race). The sink refuses the batch as an overlap; the worker must reload the
// position and apply only what follows it: every record exactly once, none skipped.
func TestOverlapAppliesOnlyTheRest(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	const n = 10 // one key: offsets 0..9 carry sequence numbers 1..10
	produce(t, brokers, "orders", 1, n)
	store := newStore(t)
	ctx := context.Background()
	key := fence.Key{Group: "g", Topic: "orders", Partition: 0}
	// A previous owner applied offsets 0..5.
	if _, err := store.Claim(ctx, key, fence.Token{}, "prev"); err != nil {
		t.Fatal(err)
	}
	if err := store.Apply(ctx, key, fence.Token{}, 0, 5, func(ctx context.Context, tx *memfence.Tx) error {
		return tx.Put("k/k0", []byte("6,6"))
	}); err != nil {
		t.Fatal(err)
	}
	f := newFolder()
	m := newMeter()
	sink := &lowballClaims{Sink: store}
	c, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](sink), nil, consumer.PerPartition(f.factory),
		consumer.Kafka(fastKafka(brokers)...), consumer.Logger(quiet), consumer.MeterProvider(m))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	const loop = 10 // refusals of overlapping batches that show a worker not filtering
	// Records skipped as already applied: at most offsets 3..5 (a batch of them alone is a
	// duplicate), never one after the sink's position 5.
	const skipped, applied = "baton.consumer.records.duplicates_skipped", 3
	// The wait ends on the first sign of either outcome, so that a broken worker fails on its
	// cause at once: the fence at the last offset, the overlap refused again and again, or
	// more records skipped than were applied.
	waitFor(t, "the fence at the last offset (or the overlap refused again and again, or records skipped)", bound(30*time.Second), func() bool {
		st, _ := store.Load(ctx, key)
		return st.Position == n-1 || sink.overlaps.Load() >= loop || m.sum(t, skipped) > applied
	})
	if o := sink.overlaps.Load(); o >= loop {
		t.Fatalf("the sink refused %d batches as overlapping its position: the worker does not cut a batch to what follows it", o)
	}
	if d := m.sum(t, skipped); d > applied {
		t.Fatalf("the worker skipped %d records as already applied, of which only %d (offsets 3..5) were: records after the sink's position were skipped, never applied", d, applied)
	}
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	if count, last := readState(store.Get("k/k0")); count != n || last != n {
		t.Fatalf("the fence reached offset %d with %d records applied (the last sequence %d), want %d: records after the sink's position were filtered out as applied (violations: %v)", n-1, count, last, n, f.Violations())
	}
	if v := f.Violations(); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
	if sink.overlaps.Load() == 0 {
		t.Fatal("no batch overlapped the sink's position: the test did not exercise the interleaving")
	}
}

// The mutant CurrentGenerationToken. A partition kept across a rebalance keeps the token of
// its assignment: only the partition that moved is claimed at the new generation. (A token
// re-read at write time would move every partition of the member to its current generation.)
func TestTokenIsTheAssignmentGeneration(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(2, "orders"))
	const keys, n1, n = 8, 3, 6
	produceSeq(t, brokers, "orders", keys, 1, n1)
	store := newStore(t)
	ctx := context.Background()
	f := newFolder()
	newMember := func() *member {
		c, err := consumer.New("g", []string{"orders"}, store, nil, consumer.PerPartition(f.factory), consumer.Kafka(fastKafka(brokers)...),
			consumer.Logger(quiet))
		if err != nil {
			t.Fatal(err)
		}
		return start(t, c)
	}
	a := newMember()
	waitFor(t, "A applies", bound(30*time.Second), allApplied(store, keys, n1))
	first := map[int32]fence.Token{}
	for p := int32(0); p < 2; p++ {
		st, _ := store.Load(ctx, fence.Key{Group: "g", Topic: "orders", Partition: p})
		first[p] = st.Token
	}
	b := newMember()
	waitFor(t, "B claims a partition", bound(30*time.Second), func() bool {
		for p := int32(0); p < 2; p++ {
			if st, _ := store.Load(ctx, fence.Key{Group: "g", Topic: "orders", Partition: p}); st.Token != first[p] {
				return true
			}
		}
		return false
	})
	produceSeq(t, brokers, "orders", keys, n1+1, n)
	waitFor(t, "everything applied", bound(30*time.Second), allApplied(store, keys, n))
	if err := b.stop(); err != nil {
		t.Fatal(err)
	}
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	checkFold(t, store, keys, n)
	kept := 0
	for p := int32(0); p < 2; p++ {
		if st, _ := store.Load(ctx, fence.Key{Group: "g", Topic: "orders", Partition: p}); st.Token == first[p] {
			kept++
		}
	}
	if kept != 1 {
		t.Fatalf("%d partitions kept A's assignment token %v; want exactly the one A kept", kept, first)
	}
}

// raiseOnDeadLetter raises the fence (another claimant, a higher token) just before the
// dead-letter write of the poison offset reaches the sink: the owner is deposed between
// deciding to dead-letter and doing it.
type raiseOnDeadLetter struct {
	fence.Sink[*memfence.Tx]
	poison atomic.Int64 // the poison record's offset, once the handler has seen it; -1 before
	raised atomic.Bool
	store  *memfence.Store
}

func (s *raiseOnDeadLetter) Apply(ctx context.Context, k fence.Key, t fence.Token, first, last int64, fn func(context.Context, *memfence.Tx) error) error {
	if p := s.poison.Load(); p >= 0 && first == p && last == p && s.raised.CompareAndSwap(false, true) {
		if _, err := s.store.Claim(ctx, k, fence.Token{Era: t.Era, Epoch: t.Epoch + 100}, "usurper"); err != nil {
			return err
		}
	}
	return s.Sink.Apply(ctx, k, t, first, last, fn)
}

// The mutant DeadLetterBeforeFence. Interleaving: the owner decides a record is poison and is
// deposed before it dead-letters it. Its dead-letter write is refused by the fence before
// anything is produced; it then proves itself current, recovers, and dead-letters the record
// once. Exactly one dead-letter record exists.
func TestDeposedOwnerDoesNotDeadLetter(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders", "orders.dlq"))
	const keys, n = 2, 3
	produceSeq(t, brokers, "orders", keys, 1, n)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: "orders", Key: []byte("x"), Value: []byte("poison")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	store := newStore(t)
	sink := &raiseOnDeadLetter{Sink: store, store: store}
	sink.poison.Store(-1)
	f := newFolder()
	f.block = func(_ context.Context, b *consumer.Batch) error {
		for _, r := range b.Records {
			if string(r.Value) == "poison" {
				sink.poison.Store(r.Offset)
				return b.Fail(r, errors.New("cannot decode"))
			}
		}
		return nil
	}
	c, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](sink), nil, consumer.PerPartition(f.factory),
		consumer.Kafka(fastKafka(brokers)...), consumer.Logger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	key := fence.Key{Group: "g", Topic: "orders", Partition: 0}
	waitFor(t, "the poison record passed", bound(30*time.Second), func() bool {
		st, _ := store.Load(context.Background(), key)
		return st.Position >= keys*n
	})
	if err := mb.stop(); err != nil {
		t.Fatal(err)
	}
	if !sink.raised.Load() {
		t.Fatal("the fence was never raised before the dead-letter write: the test did not exercise the interleaving")
	}
	rd, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("orders.dlq"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	var got int
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		got += len(rd.PollFetches(ctx).Records())
		cancel()
	}
	if got != 1 {
		t.Fatalf("dead-letter topic holds %d records, want 1", got)
	}
}

// inflightWatch records whether a claim of a partition starts while another member's batch of
// that partition is still in its handler.
type inflightWatch struct {
	fence.Sink[*memfence.Tx]
	inflight *sync.Map // fence.Key -> *atomic.Int32
	overlap  atomic.Bool
}

func (s *inflightWatch) Claim(ctx context.Context, k fence.Key, t fence.Token, c string) (fence.State, error) {
	if v, ok := s.inflight.Load(k); ok && v.(*atomic.Int32).Load() > 0 {
		s.overlap.Store(true)
	}
	return s.Sink.Claim(ctx, k, t, c)
}

// The mutant RevokeDoesNotWait. Interleaving: A's batch is in its handler when B joins and the
// partition is revoked from A. The revoke must wait for the batch (which sees its context
// cancelled and rolls back) before it returns, so B's claim of the partition starts only after
// A's batch has left the handler.
func TestRevokeWaitsForTheInflightBatch(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(2, "orders"))
	const keys = 8
	produceSeq(t, brokers, "orders", keys, 1, 1)
	store := newStore(t)
	var inflight sync.Map
	watch := &inflightWatch{Sink: store, inflight: &inflight}
	fa := newFolder()
	fa.block = func(ctx context.Context, b *consumer.Batch) error {
		v, _ := inflight.LoadOrStore(b.Key, new(atomic.Int32))
		n := v.(*atomic.Int32)
		n.Add(1)
		defer n.Add(-1)
		<-ctx.Done()            // held until revoked
		time.Sleep(time.Second) // rolling back takes a while
		return ctx.Err()
	}
	a, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](store), nil, consumer.PerPartition(fa.factory),
		consumer.Kafka(fastKafka(brokers)...), consumer.Logger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	ma := start(t, a)
	waitFor(t, "A's batches in their handler", bound(30*time.Second), func() bool {
		busy := 0
		inflight.Range(func(_, v any) bool {
			if v.(*atomic.Int32).Load() > 0 {
				busy++
			}
			return true
		})
		return busy == 2
	})
	fb := newFolder()
	b, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](watch), nil, consumer.PerPartition(fb.factory),
		consumer.Kafka(fastKafka(brokers)...), consumer.Logger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, b)
	waitFor(t, "B claims a partition", bound(30*time.Second), func() bool {
		for p := int32(0); p < 2; p++ {
			if st, _ := store.Load(context.Background(), fence.Key{Group: "g", Topic: "orders", Partition: p}); st.Token.Epoch > 1 {
				return true
			}
		}
		return false
	})
	_ = mb.stop()
	_ = ma.stop()
	if watch.overlap.Load() {
		t.Fatal("B claimed a partition while A's batch of it was still in the handler: the revoke returned early")
	}
}

// A recreated group's zombie at a higher generation. Interleaving: a recreated group's new owner N holds the fence
// in era 1 at a low generation; a member Z of the old incarnation, assigned at a higher
// generation of the old one and paused before its claim, loads era 1 and claims {1, its
// generation}: higher, so the sink accepts it. Only the coordinator can tell Z is not a member
// (member ids are generated per join, so the new incarnation does not know Z's): the claim is
// verified before the first write, and Z gives up without writing.
func TestClaimVerifiedBeforeFirstWrite(t *testing.T) {
	c, brokers := fakeCluster(t, kfake.SeedTopics(1, "orders"))
	const keys, n = 2, 4
	produce(t, brokers, "orders", keys, n)
	store := newStore(t)
	ctx := context.Background()
	key := fence.Key{Group: "g", Topic: "orders", Partition: 0}
	if _, err := store.Recover(ctx, key, fence.Token{}, 0, "N", "test: the recreated group's owner"); err != nil {
		t.Fatal(err)
	}
	// The coordinator Z reaches is the new incarnation's: it does not know Z's member id.
	c.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		r := req.(*kmsg.OffsetCommitRequest)
		resp := r.ResponseKind().(*kmsg.OffsetCommitResponse)
		for _, rt := range r.Topics {
			st := kmsg.NewOffsetCommitResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewOffsetCommitResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, kerr.UnknownMemberID.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	f := newFolder()
	m := newMeter()
	z, err := consumer.New("g", []string{"orders"}, store, nil, consumer.PerPartition(f.factory), consumer.Kafka(fastKafka(brokers)...),
		consumer.Logger(quiet), consumer.MeterProvider(m))
	if err != nil {
		t.Fatal(err)
	}
	mz := start(t, z)
	// Z gives up, writes, or keeps being refused (a refusal of the generation its client still
	// believes current is "cannot tell" and retried): it must never write.
	waitFor(t, "Z gives up, writes or is refused again", bound(30*time.Second), func() bool {
		return m.sum(t, "baton.consumer.stale_refusals") >= 1 || m.sum(t, "baton.consumer.records.applied") > 0 ||
			m.sum(t, "baton.consumer.retries") >= 3
	})
	time.Sleep(300 * time.Millisecond) // a write, had one started, would land meanwhile
	_ = mz.stop()
	if got := m.sum(t, "baton.consumer.records.applied"); got != 0 {
		t.Fatalf("Z applied %d records under a claim the coordinator did not vouch for", got)
	}
	if st, _ := store.Load(ctx, key); st.Position != fence.NoPosition {
		t.Fatalf("fence position moved to %d", st.Position)
	}
}
