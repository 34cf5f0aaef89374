package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/memfence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// sqlStateError is a database error carrying a SQLSTATE, as pgconn.PgError does.
type sqlStateError struct{ code, msg string }

func (e *sqlStateError) Error() string    { return e.msg + " (SQLSTATE " + e.code + ")" }
func (e *sqlStateError) SQLState() string { return e.code }

// failingSink fails every Load and Claim with err while failing is set, as a member whose
// database refuses it would.
type failingSink struct {
	fence.Sink[*memfence.Tx]
	err     error
	failing atomic.Bool
}

func newFailingSink(s fence.Sink[*memfence.Tx], err error) *failingSink {
	f := &failingSink{Sink: s, err: err}
	f.failing.Store(true)
	return f
}

func (f *failingSink) Claim(ctx context.Context, k fence.Key, t fence.Token, claimant string) (fence.State, error) {
	if f.failing.Load() {
		return fence.State{}, fmt.Errorf("claim %s: %w", k, f.err)
	}
	return f.Sink.Claim(ctx, k, t, claimant)
}

func (f *failingSink) Load(ctx context.Context, k fence.Key) (fence.State, error) {
	if f.failing.Load() {
		return fence.State{}, fmt.Errorf("load %s: %w", k, f.err)
	}
	return f.Sink.Load(ctx, k)
}

// A member whose database refuses it for good (a wrong password, here) beside a healthy one:
// within UnusableSinkAfter its Run ends with ErrSinkUnusable naming the cause, it leaves the
// group, and the healthy member claims and applies its partitions.
func TestUnusableSinkGivesPartitionsBack(t *testing.T) {
	for _, code := range []string{"28P01", "42P01", "42501"} {
		t.Run(code, func(t *testing.T) {
			brokers := fakeKafka(t, kfake.SeedTopics(4, "orders"))
			const keys, n = 64, 5
			store := newStore(t)
			f := newFolder()
			bad := newFailingSink(store, &sqlStateError{code: code, msg: "refused"})
			opts := []consumer.Option{consumer.PerPartition(f.factory), consumer.Kafka(fastKafka(brokers)...),
				consumer.Logger(quiet), consumer.RetryBackoff(50*time.Millisecond, 200*time.Millisecond),
				consumer.UnusableSinkAfter(time.Second), consumer.ClaimWait(100 * time.Millisecond)}
			a, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](store), nil, opts...)
			if err != nil {
				t.Fatal(err)
			}
			ma := start(t, a)
			produce(t, brokers, "orders", keys, 1)
			waitFor(t, "the healthy member applies the first records", 30*time.Second, allApplied(store, keys, 1))
			b, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](bad), nil, opts...)
			if err != nil {
				t.Fatal(err)
			}
			mb := start(t, b)
			waitFor(t, "the bad member is assigned", 30*time.Second, func() bool { return b.Readiness().Assigned > 0 })
			produceSeq(t, brokers, "orders", keys, 2, n)
			waitFor(t, "the healthy member applies every partition", 30*time.Second, allApplied(store, keys, n))
			select {
			case err := <-mb.done:
				mb.done <- err // for stop, at cleanup
				if !errors.Is(err, consumer.ErrSinkUnusable) || !strings.Contains(err.Error(), code) {
					t.Fatalf("the bad member's Run returned %v, want ErrSinkUnusable naming SQLSTATE %s", err, code)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the bad member's Run did not return")
			}
			if err := ma.stop(); err != nil {
				t.Fatalf("healthy member: %v", err)
			}
			checkFold(t, store, keys, n)
		})
	}
}

// A database outage (errors that pass when the database is back) never makes a member leave:
// it keeps its partitions, retrying, long past UnusableSinkAfter, and applies them once the
// database answers again.
func TestTransientSinkOutageKeepsMember(t *testing.T) {
	for _, err := range []error{
		&sqlStateError{code: "57P03", msg: "the database system is starting up"},
		errors.New("dial tcp 127.0.0.1:5432: connect: connection refused"),
	} {
		t.Run(err.Error(), func(t *testing.T) {
			brokers := fakeKafka(t, kfake.SeedTopics(2, "orders"))
			const keys, n = 4, 5
			store := newStore(t)
			f := newFolder()
			s := newFailingSink(store, err)
			c, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](s), nil, consumer.PerPartition(f.factory),
				consumer.Kafka(fastKafka(brokers)...), consumer.Logger(quiet),
				consumer.RetryBackoff(20*time.Millisecond, 50*time.Millisecond), consumer.UnusableSinkAfter(200*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			m := start(t, c)
			produce(t, brokers, "orders", keys, n)
			waitFor(t, "the member is assigned", 30*time.Second, func() bool { return c.Readiness().Assigned == 2 })
			select {
			case err := <-m.done:
				m.done <- err
				t.Fatalf("Run returned %v during a transient outage", err)
			case <-time.After(2 * time.Second): // ten times the bound
			}
			s.failing.Store(false)
			waitFor(t, "everything applied once the database is back", 30*time.Second, allApplied(store, keys, n))
			if err := m.stop(); err != nil {
				t.Fatal(err)
			}
			checkFold(t, store, keys, n)
		})
	}
}

// On the real broker and the real PostgreSQL: a member whose database login fails (a wrong
// password) or whose fence table is missing, beside a healthy member: within
// UnusableSinkAfter it leaves the group naming the SQLSTATE, and the healthy member claims and
// applies its partitions.
func TestRealUnusableSinkGivesPartitionsBack(t *testing.T) {
	for _, tc := range []struct {
		name, code string
		static     bool // the bad member is static (kgo.InstanceID), with a 5 minute session timeout
	}{{"wrong password", "28P01", false}, {"missing table", "42P01", false}, {"wrong password, static member", "28P01", true}} {
		t.Run(tc.name, func(t *testing.T) {
			brokers := testenv.KafkaBrokers(t)
			pool, sink := newPG(t)
			topic := testenv.NewTopic(t, brokers, 4)
			group := testenv.UniqueName("g")
			const keys, n = 64, 5
			var badSink *pgfence.Store
			switch tc.code {
			case "28P01":
				cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
				if err != nil {
					t.Fatal(err)
				}
				cfg.ConnConfig.Password += "-wrong"
				bad, err := pgxpool.NewWithConfig(context.Background(), cfg)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(bad.Close)
				if badSink, err = pgfence.New(bad); err != nil {
					t.Fatal(err)
				}
			case "42P01":
				var err error
				if badSink, err = pgfence.New(pool, pgfence.Table("fences_not_migrated")); err != nil {
					t.Fatal(err)
				}
			}
			opts := []consumer.Option{consumer.Kafka(realKafka(brokers)...), consumer.Logger(quiet),
				consumer.GroupProtocol(testenv.GroupProtocol()), consumer.PerPartition(pgFolder),
				consumer.RetryBackoff(50*time.Millisecond, 500*time.Millisecond),
				consumer.UnusableSinkAfter(2 * time.Second), consumer.ClaimWait(100 * time.Millisecond)}
			a, err := consumer.New(group, []string{topic}, sink, nil, opts...)
			if err != nil {
				t.Fatal(err)
			}
			ma := start(t, a)
			produceSeq(t, brokers, topic, keys, 1, 1)
			waitFor(t, "the healthy member applies the first records", time.Minute, func() bool { return pgApplied(t, pool) >= keys })
			badOpts, bound := opts, time.Minute
			if tc.static {
				// Well under the session timeout: the partitions move because the member is
				// removed, not because its session expired.
				badOpts = append(opts[1:len(opts):len(opts)], consumer.Kafka(append(realKafka(brokers),
					kgo.InstanceID(testenv.UniqueName("static")), kgo.SessionTimeout(5*time.Minute))...))
				bound = 30 * time.Second
			}
			b, err := consumer.New(group, []string{topic}, badSink, nil, badOpts...)
			if err != nil {
				t.Fatal(err)
			}
			mb := start(t, b)
			waitFor(t, "the bad member is assigned", time.Minute, func() bool { return b.Readiness().Assigned > 0 })
			began := time.Now()
			produceSeq(t, brokers, topic, keys, 2, n)
			waitFor(t, "the healthy member applies every partition", bound, func() bool { return pgApplied(t, pool) >= keys*n })
			t.Logf("the bad member's partitions applied by the healthy member %v after it was assigned them", time.Since(began).Round(time.Millisecond))
			select {
			case err := <-mb.done:
				mb.done <- err
				if !errors.Is(err, consumer.ErrSinkUnusable) || !strings.Contains(err.Error(), tc.code) {
					t.Fatalf("the bad member's Run returned %v, want ErrSinkUnusable naming SQLSTATE %s", err, tc.code)
				}
				t.Logf("bad member: %v", err)
			case <-time.After(30 * time.Second):
				t.Fatal("the bad member's Run did not return")
			}
			if err := ma.stop(); err != nil {
				t.Fatalf("healthy member: %v", err)
			}
			var bad int
			if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM kv WHERE count <> $1 OR last <> $1`, n).Scan(&bad); err != nil {
				t.Fatal(err)
			}
			if bad != 0 {
				t.Fatalf("%d keys differ from the fold of their records", bad)
			}
		})
	}
}

// On the real broker, with the real PostgreSQL driver: a database that refuses connections (an
// outage, here a port nothing listens on) never makes the member leave, however long it
// lasts past UnusableSinkAfter; its retries turn to ERROR past the bound.
func TestRealDatabaseOutageKeepsMember(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := testenv.NewTopic(t, brokers, 1)
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := strings.Cut(deadAddr(t), ":")
	cfg.ConnConfig.Host = host
	fmt.Sscan(port, &cfg.ConnConfig.Port)
	cfg.ConnConfig.ConnectTimeout = time.Second
	down, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(down.Close)
	sink, err := pgfence.New(down)
	if err != nil {
		t.Fatal(err)
	}
	var book logBook
	c, err := consumer.New(testenv.UniqueName("g"), []string{topic}, sink, nil, consumer.PerPartition(pgFolder),
		consumer.Kafka(realKafka(brokers)...), consumer.Logger(slog.New(&book)),
		consumer.RetryBackoff(50*time.Millisecond, 200*time.Millisecond),
		consumer.UnusableSinkAfter(500*time.Millisecond), consumer.StalledAfter(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	m := start(t, c)
	waitFor(t, "an ERROR for the stalled claim", time.Minute, func() bool {
		return len(book.find(slog.LevelError, "kept failing")) > 0
	})
	e := book.find(slog.LevelError, "kept failing")[0]
	t.Logf("%s: op %s: %s", e.msg, e.attrs["op"], e.attrs["err"])
	select {
	case err := <-m.done:
		m.done <- err
		t.Fatalf("Run returned %v during an outage", err)
	case <-time.After(5 * time.Second): // ten times the bound
	}
	if r := c.Readiness(); r.Assigned != 1 {
		t.Fatalf("the member gave its partition up during an outage: %v", r)
	}
}

// A static member (kgo.InstanceID) that cannot use its sink: closing its client sends no
// LeaveGroup, so without more its partitions would stay assigned to its instance for the whole
// session timeout (30s here), and come back to it if it restarted within it. Its Run leaves
// the group by its instance id: the healthy member claims and applies its partitions well
// within the session timeout.
func TestUnusableSinkStaticMemberLeaves(t *testing.T) {
	for _, protocol := range []string{"classic", "consumer"} {
		t.Run(protocol, func(t *testing.T) { unusableStaticMemberLeaves(t, protocol) })
	}
}

func unusableStaticMemberLeaves(t *testing.T, protocol string) {
	brokers := fakeKafka(t, kfake.SeedTopics(4, "orders"))
	const keys, n = 64, 5
	store := newStore(t)
	f := newFolder()
	bad := newFailingSink(store, &sqlStateError{code: "28P01", msg: "password authentication failed"})
	opts := []consumer.Option{consumer.PerPartition(f.factory), consumer.Logger(quiet), consumer.GroupProtocol(protocol),
		consumer.RetryBackoff(50*time.Millisecond, 200*time.Millisecond),
		consumer.UnusableSinkAfter(time.Second), consumer.ClaimWait(100 * time.Millisecond)}
	a, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](store), nil,
		append(opts, consumer.Kafka(fastKafka(brokers)...))...)
	if err != nil {
		t.Fatal(err)
	}
	ma := start(t, a)
	produce(t, brokers, "orders", keys, 1)
	waitFor(t, "the healthy member applies the first records", 30*time.Second, allApplied(store, keys, 1))
	b, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](bad), nil,
		append(opts, consumer.Kafka(append(fastKafka(brokers), kgo.InstanceID("bad"), kgo.SessionTimeout(30*time.Second))...))...)
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, b)
	waitFor(t, "the bad member is assigned", 30*time.Second, func() bool { return b.Readiness().Assigned > 0 })
	select {
	case err := <-mb.done:
		mb.done <- err // for stop, at cleanup
		if !errors.Is(err, consumer.ErrSinkUnusable) {
			t.Fatalf("the bad member's Run returned %v, want ErrSinkUnusable", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the bad member's Run did not return")
	}
	ended := time.Now()
	produceSeq(t, brokers, "orders", keys, 2, n)
	waitFor(t, "the healthy member applies every partition within half the static member's session timeout",
		15*time.Second, allApplied(store, keys, n))
	t.Logf("the static member's partitions applied by the healthy member %v after its Run ended", time.Since(ended).Round(time.Millisecond))
	if err := ma.stop(); err != nil {
		t.Fatalf("healthy member: %v", err)
	}
	checkFold(t, store, keys, n)
}

// oneKeyFailing fails every Load and Claim of the first partition it is asked about with err;
// the member's other partitions claim and apply normally.
type oneKeyFailing struct {
	fence.Sink[*memfence.Tx]
	err  error
	mu   sync.Mutex
	key  *fence.Key
	hits atomic.Int64
}

func (f *oneKeyFailing) failing(k fence.Key) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.key == nil {
		f.key = &k
	}
	if *f.key == k {
		f.hits.Add(1)
		return true
	}
	return false
}

func (f *oneKeyFailing) Claim(ctx context.Context, k fence.Key, t fence.Token, claimant string) (fence.State, error) {
	if f.failing(k) {
		return fence.State{}, fmt.Errorf("claim %s: %w", k, f.err)
	}
	return f.Sink.Claim(ctx, k, t, claimant)
}

func (f *oneKeyFailing) Load(ctx context.Context, k fence.Key) (fence.State, error) {
	if f.failing(k) {
		return fence.State{}, fmt.Errorf("load %s: %w", k, f.err)
	}
	return f.Sink.Load(ctx, k)
}

// A member that cannot claim one of its partitions leaves while its other partitions are in
// the middle of slow batches, records arriving all the while: the batches in flight commit or
// roll back before it leaves, the healthy member resumes every partition from the sink's
// position, and every key's state is the fold of its records, none lost or applied twice.
func TestUnusableSinkLeavesMidApply(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(4, "orders"))
	const keys, n = 64, 30
	store := newStore(t)
	fa, fb := newFolder(), newFolder()
	var leftMidApply atomic.Bool
	var batches atomic.Int64
	fb.block = func(ctx context.Context, b *consumer.Batch) error {
		// The bad member's first batch is held until the member leaves, so that a batch is
		// in flight when it does, however the scheduler orders the leave; its later batches
		// (other partitions, or after the hold) take 150ms and commit.
		hold := 150 * time.Millisecond
		if batches.Add(1) == 1 {
			hold = 30 * time.Second
		}
		select {
		case <-ctx.Done():
			leftMidApply.Store(true)
			return ctx.Err()
		case <-time.After(hold):
			return nil
		}
	}
	bad := &oneKeyFailing{Sink: store, err: &sqlStateError{code: "42501", msg: "permission denied for table fences"}}
	common := []consumer.Option{consumer.Kafka(fastKafka(brokers)...), consumer.Logger(quiet),
		consumer.RetryBackoff(50*time.Millisecond, 200*time.Millisecond),
		consumer.UnusableSinkAfter(time.Second), consumer.ClaimWait(100 * time.Millisecond), consumer.MaxInflightPerPartition(8)}
	a, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](store), nil, append(common, consumer.PerPartition(fa.factory))...)
	if err != nil {
		t.Fatal(err)
	}
	ma := start(t, a)
	produce(t, brokers, "orders", keys, 1)
	waitFor(t, "the healthy member applies the first records", 30*time.Second, allApplied(store, keys, 1))
	b, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](bad), nil, append(common, consumer.PerPartition(fb.factory))...)
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, b)
	waitFor(t, "the bad member is assigned", 30*time.Second, func() bool { return b.Readiness().Assigned > 0 })
	for r := 2; r <= n; r++ {
		produceSeq(t, brokers, "orders", keys, r, r)
		time.Sleep(100 * time.Millisecond)
	}
	waitFor(t, "every partition applied", 60*time.Second, allApplied(store, keys, n))
	select {
	case err := <-mb.done:
		mb.done <- err
		if !errors.Is(err, consumer.ErrSinkUnusable) {
			t.Fatalf("the bad member's Run returned %v, want ErrSinkUnusable", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the bad member's Run did not return")
	}
	if err := ma.stop(); err != nil {
		t.Fatalf("healthy member: %v", err)
	}
	if bad.hits.Load() == 0 {
		t.Fatal("the bad member never tried the failing partition")
	}
	if !leftMidApply.Load() {
		t.Fatalf("the bad member had no batch in flight when it left (%d batches attempted): the test did not exercise a leave mid-apply", fb.attemptsTotal())
	}
	checkFold(t, store, keys, n)
	for _, f := range []*folder{fa, fb} {
		if v := f.Violations(); len(v) > 0 {
			t.Fatalf("violations: %v", v)
		}
	}
}

// attemptsTotal is the number of handler calls over every partition.
func (f *folder) attemptsTotal() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	total := 0
	for _, n := range f.attempts {
		total += n
	}
	return total
}
