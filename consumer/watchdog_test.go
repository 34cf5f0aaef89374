package consumer_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
	"github.com/batonhq/baton/internal/testkit/netfreeze"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A busy member whose network freezes: its session expires at the coordinator while its
// worker still has a backlog of fetched records, each a 10ms "remote call" in the handler.
// The watchdog must stop it: no handler call starts after it fired, and at most one heartbeat
// interval's worth of calls start after the coordinator dropped the member (observed from
// another client). After the thaw the member rejoins and applies everything exactly once.
// WatchdogOff (the watchdog never fires) fails it: the zombie keeps calling its handler.
func TestWatchdogStopsAnExpiredMember(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	watchdogZombie(t, brokers, "orders", "g", fastKafka(brokers))
}

// The same against the real broker (session 6s, the broker's minimum by default).
func TestRealWatchdogStopsAnExpiredMember(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	watchdogZombie(t, brokers, testenv.NewTopic(t, brokers, 1), testenv.UniqueName("g"), realKafka(brokers))
}

// logSpy records whether a message containing want was logged.
type logSpy struct {
	slog.Handler
	want string
	seen *atomic.Bool
}

func (s logSpy) Enabled(context.Context, slog.Level) bool { return true }
func (s logSpy) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, s.want) {
		s.seen.Store(true)
	}
	return s.Handler.Handle(ctx, r)
}
func (s logSpy) WithAttrs(as []slog.Attr) slog.Handler {
	return logSpy{Handler: s.Handler.WithAttrs(as), want: s.want, seen: s.seen}
}
func (s logSpy) WithGroup(n string) slog.Handler {
	return logSpy{Handler: s.Handler.WithGroup(n), want: s.want, seen: s.seen}
}

func watchdogZombie(t *testing.T, brokers []string, topic, group string, kopts []kgo.Opt) {
	const keys, call = 4, 10 * time.Millisecond // one record per batch, a 10ms remote call each
	var interval, session time.Duration
	{
		cl, err := kgo.NewClient(kopts...)
		if err != nil {
			t.Fatal(err)
		}
		session, _ = cl.OptValue(kgo.SessionTimeout).(time.Duration)
		interval, _ = cl.OptValue(kgo.HeartbeatInterval).(time.Duration)
		cl.Close()
	}
	n := int(2*session/call)/keys + 10 // twice the session's worth of calls
	produceSeq(t, brokers, topic, keys, 1, n)
	store := newStore(t)
	fz := netfreeze.New()
	defer fz.Thaw()

	var fired atomic.Bool
	var calls, afterFire atomic.Int64
	f := newFolder()
	f.block = func(ctx context.Context, _ *consumer.Batch) error {
		calls.Add(1)
		if fired.Load() {
			afterFire.Add(1)
		}
		select { // the remote call
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(call):
			return nil
		}
	}
	log := slog.New(logSpy{Handler: quiet.Handler(), want: "group session expired", seen: &fired})
	m := newMeter()
	a, err := consumer.New(group, []string{topic}, fence.Sink[*memfence.Tx](store), nil, consumer.PerPartition(f.factory),
		consumer.Kafka(append(kopts, kgo.Dialer(fz.Dial), kgo.RequestTimeoutOverhead(time.Second))...),
		consumer.Logger(log), consumer.MeterProvider(m), consumer.MaxInflightPerPartition(1), consumer.MaxInflight(1))
	if err != nil {
		t.Fatal(err)
	}
	ma := start(t, a)

	adm, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	members := func() int {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		gs, err := kadm.NewClient(adm).DescribeGroups(ctx, group)
		if err != nil {
			return -1
		}
		g, ok := gs[group]
		if !ok || g.Err != nil {
			return -1
		}
		return len(g.Members)
	}
	waitFor(t, "A joins and is busy", 30*time.Second, func() bool { return members() == 1 && calls.Load() >= 20 })
	fz.Freeze()
	frozeAt := calls.Load()

	waitFor(t, "the coordinator drops the frozen member", session+30*time.Second, func() bool { return members() == 0 })
	expiredAt := calls.Load()
	if expiredAt-frozeAt < int64(session/(2*call)) {
		// The freeze did not leave the member busy through its session: nothing to prove.
		t.Fatalf("the frozen member made only %d handler calls before its session expired; the test did not exercise a busy zombie", expiredAt-frozeAt)
	}
	// Give the watchdog (at most one heartbeat interval after the expiry) and a margin.
	bound := time.Now().Add(interval + 5*time.Second)
	for !fired.Load() && time.Now().Before(bound) {
		time.Sleep(10 * time.Millisecond)
	}
	if !fired.Load() {
		t.Fatalf("the watchdog never fired: the zombie made %d handler calls after the coordinator dropped it", calls.Load()-expiredAt)
	}
	firedAt := calls.Load()
	time.Sleep(20 * call) // would-be calls of a zombie that kept going
	zombie := afterFire.Load()
	if zombie > 1 {
		t.Errorf("%d handler calls started after the watchdog fired, want at most the one racing it", zombie)
	}
	if late, most := firedAt-expiredAt, int64(interval/call)+2; late > most {
		t.Errorf("%d handler calls started between the coordinator dropping the member and the watchdog, want at most %d (one heartbeat interval's worth)", late, most)
	}
	if got := m.sum(t, "baton.consumer.watchdog.stops"); got != 1 {
		t.Errorf("baton.consumer.watchdog.stops = %d, want 1", got)
	}
	if fz.Freezes() != 1 {
		t.Fatalf("the network froze %d times, want 1", fz.Freezes())
	}

	fz.Thaw()
	waitFor(t, "A rejoins and applies everything", 60*time.Second, allApplied(store, keys, n))
	if err := ma.stop(); err != nil {
		t.Fatalf("A: %v", err)
	}
	checkFold(t, store, keys, n)
	if v := f.Violations(); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
	t.Logf("handler calls: %d before the freeze, %d until the expiry, %d until the watchdog fired, %d after it (before the thaw)", frozeAt, expiredAt-frozeAt, firedAt-expiredAt, zombie)
}

// A false expiry: the watchdog's clock jumps past the session timeout once while the member is
// alive (it stands for a coordinator answer delayed past it). The watchdog stops the
// partition; the coordinator answers again and franz-go keeps the partition assigned, so the
// watchdog restarts it under the same claimant and epoch: everything is applied exactly once,
// with no regression recovery (a restart under a new claimant would move to a new era). Without
// the restart the partition stays stopped and the test fails.
func TestWatchdogRestartsAPartitionStillAssigned(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	const keys, n, call = 4, 100, 5 * time.Millisecond
	produceSeq(t, brokers, "orders", keys, 1, n)
	store := newStore(t)
	var fired, restarted atomic.Bool
	var calls atomic.Int64
	f := newFolder()
	f.block = func(ctx context.Context, _ *consumer.Batch) error {
		calls.Add(1)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(call):
			return nil
		}
	}
	log := slog.New(logSpy{Handler: logSpy{Handler: quiet.Handler(), want: "group session expired", seen: &fired}, want: "restarted them", seen: &restarted})
	m := newMeter()
	a, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](store), nil, consumer.PerPartition(f.factory),
		consumer.Kafka(fastKafka(brokers)...), consumer.Logger(log), consumer.MeterProvider(m),
		consumer.MaxInflightPerPartition(1), consumer.MaxInflight(1))
	if err != nil {
		t.Fatal(err)
	}
	ma := start(t, a)
	waitFor(t, "A is busy", 30*time.Second, func() bool { return calls.Load() >= 20 })
	consumer.SkewWatchdog(a, time.Hour)
	waitFor(t, "the watchdog fires", 30*time.Second, fired.Load) // which resets the jump
	waitFor(t, "the watchdog restarts the partition", 30*time.Second, restarted.Load)
	waitFor(t, "A applies everything", 60*time.Second, allApplied(store, keys, n))
	if err := ma.stop(); err != nil {
		t.Fatalf("A: %v", err)
	}
	checkFold(t, store, keys, n)
	if v := f.Violations(); len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
	if got := m.sum(t, "baton.consumer.watchdog.stops"); got != 1 {
		t.Errorf("baton.consumer.watchdog.stops = %d, want 1", got)
	}
	if got := m.sum(t, "baton.consumer.recoveries"); got != 0 {
		t.Errorf("baton.consumer.recoveries = %d, want 0: the restart claimed as another claimant", got)
	}
}

// A revive with no position keeps every record: a false expiry during the partition's very
// first batch (the sink holds no position for it yet). The old worker's whole fetch is
// dispatched to it and dropped when it stops; the revived worker's claim finds no position,
// so without the seek back to the first offset it was handed (claimResolved) fetching would
// resume at the client's cursor, past the dropped records, and they would never be applied
// (once a later record is, the sink's position covers them for good).
func TestWatchdogRestartWithNoPositionKeepsEveryRecord(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	const keys, n = 4, 25
	produceSeq(t, brokers, "orders", keys, 1, n)
	store := newStore(t)
	var fired, restarted atomic.Bool
	var calls atomic.Int64
	f := newFolder()
	var a *consumer.Consumer[*memfence.Tx] // the member, set before it runs
	f.block = func(ctx context.Context, _ *consumer.Batch) error {
		if calls.Add(1) == 1 { // the first batch ever: stays in flight until the watchdog fires
			consumer.SkewWatchdog(a, time.Hour)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(30 * time.Second):
				return nil
			}
		}
		return nil
	}
	log := slog.New(logSpy{Handler: logSpy{Handler: quiet.Handler(), want: "group session expired", seen: &fired}, want: "restarted them", seen: &restarted})
	var err error
	a, err = consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](store), nil, consumer.PerPartition(f.factory),
		consumer.Kafka(fastKafka(brokers)...), consumer.Logger(log),
		consumer.MaxInflightPerPartition(1), consumer.MaxInflight(1))
	if err != nil {
		t.Fatal(err)
	}
	ma := start(t, a)
	defer func() { _ = ma.stop() }()
	waitFor(t, "the watchdog fires", 30*time.Second, fired.Load)
	waitFor(t, "the watchdog restarts the partition", 30*time.Second, restarted.Load)
	waitFor(t, "A applies everything", 20*time.Second, allApplied(store, keys, n))
	checkFold(t, store, keys, n)
}
