package chaos_test

// The seeds' Scenarios 3, 4 and 5 on the real broker and the real PostgreSQL: a write delayed
// in the network, a member partitioned from Kafka past its session timeout, and database
// failover. Each test first proves that its fault happened (bytes held then delivered, a
// session that really expired, backends really terminated, a copy really older), then judges
// the outcome. Top-level identifiers are prefixed netsc; Scenarios 1, 2 and 6 live in
// scenarios_test.go.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/testkit/netfreeze"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// netscWritesDDL is the data of Scenarios 3 and 5: one row per applied batch, with the token
// it was written under (the token column is what makes divergence detectable, Scenario 5).
const netscWritesDDL = `CREATE TABLE netsc_writes (
	position bigint NOT NULL, writer text NOT NULL, era bigint NOT NULL, epoch bigint NOT NULL)`

// The seeds' tokens: A holds 0.5, B takes over with 0.6 (era 0, epochs 5 and 6).
var (
	netscKey  = fence.Key{Group: "g", Topic: "orders", Partition: 0}
	netscTokA = fence.Token{Era: 0, Epoch: 5}
	netscTokB = fence.Token{Era: 0, Epoch: 6}
)

// netscInsert is a batch's user write: one row tagged with its writer and token. before, if
// set, runs inside the transaction after the fence passed and before the write is sent.
func netscInsert(writer string, t fence.Token, pos int64, before func()) func(context.Context, pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		if before != nil {
			before()
		}
		_, err := tx.Exec(ctx, `INSERT INTO netsc_writes VALUES ($1, $2, $3, $4)`, pos, writer, t.Era, t.Epoch)
		return err
	}
}

// netscRow is one row of netsc_writes.
type netscRow struct {
	Position int64
	Writer   string
	Token    fence.Token
}

func (r netscRow) String() string { return fmt.Sprintf("%d:%s@%s", r.Position, r.Writer, r.Token) }

func netscRows(t *testing.T, ctx context.Context, db pgfence.DB, table string) []netscRow {
	t.Helper()
	rows, err := db.Query(ctx, `SELECT position, writer, era, epoch FROM `+table+` ORDER BY position, writer`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (netscRow, error) {
		var x netscRow
		err := r.Scan(&x.Position, &x.Writer, &x.Token.Era, &x.Token.Epoch)
		return x, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func netscSameRows(got []netscRow, want ...netscRow) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}

// netscPG makes a fresh schema with the fence tables and netsc_writes, A's claim at 0.5
// already stored, and returns the pool, the store on it and the schema.
func netscPG(t *testing.T, ctx context.Context) (*pgxpool.Pool, *pgfence.Store, string) {
	t.Helper()
	pool, schema := testenv.Postgres(t)
	if _, err := pool.Exec(ctx, netscWritesDDL); err != nil {
		t.Fatal(err)
	}
	store, err := pgfence.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Claim(ctx, netscKey, netscTokA, "test"); err != nil {
		t.Fatal(err)
	}
	return pool, store, schema
}

// netscConnect opens one connection on schema, to the server named by the configured URL or,
// with via set, through that address (the proxy).
func netscConnect(t *testing.T, ctx context.Context, schema string, via *net.TCPAddr) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["search_path"] = schema
	if via != nil {
		cfg.Host, cfg.Port, cfg.Fallbacks = via.IP.String(), uint16(via.Port), nil
	}
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// netscUpstream is the host:port of the configured PostgreSQL.
func netscUpstream(t *testing.T) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
}

func netscPid(t *testing.T, ctx context.Context, c *pgx.Conn) int32 {
	t.Helper()
	var pid int32
	if err := c.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

// netscWaitFor polls cond until it holds; the bound is a liveness guard, not an assertion on
// time.
func netscWaitFor(t *testing.T, what string, bound time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func netscLoad(t *testing.T, ctx context.Context, s *pgfence.Store) fence.State {
	t.Helper()
	st, err := s.Load(ctx, netscKey)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// Scenario 3 (network delay of a write): A, holding 0.5, sends a write that a congested link
// delays. (a) The lock was never lost: the late write commits. (b) The lease expired meanwhile
// and B took over with 0.6 and wrote: the late write reaches the server and is refused. (c) The
// other order: A's fence advance reached the server before the delay, so A's transaction holds
// the fence row; B's claim waits for it, A's commit is legitimately first, and B resumes
// after it. No clock is consulted in any variant.
func TestScenario3NetworkDelay(t *testing.T) {
	t.Run("a_lock_never_lost", func(t *testing.T) {
		ctx := testenv.Context(t, 2*time.Minute)
		pool, store, schema := netscPG(t, ctx)
		proxy := netscNewProxy(t, netscUpstream(t))
		sinkA, err := pgfence.New(netscConnect(t, ctx, schema, proxy.addr()))
		if err != nil {
			t.Fatal(err)
		}
		before := proxy.counters()
		proxy.hold() // from the first byte of the Apply
		done := make(chan error, 1)
		go func() { done <- sinkA.Apply(ctx, netscKey, netscTokA, 1, 1, netscInsert("A", netscTokA, 1, nil)) }()
		netscWaitFor(t, "A's first bytes held", time.Minute, func() bool { return proxy.counters().held > 0 })

		// While held, nothing of A's transaction reached the server.
		if c := proxy.counters(); c.forwarded != before.forwarded {
			t.Fatalf("%d bytes of A's transaction were forwarded during the hold", c.forwarded-before.forwarded)
		}
		if st := netscLoad(t, ctx, store); st.Token != netscTokA || st.Position != fence.NoPosition {
			t.Fatalf("fence moved while A's write was held: %+v", st)
		}
		select {
		case err := <-done:
			t.Fatalf("A's Apply returned (%v) while its bytes were held", err)
		default:
		}

		if err := proxy.release(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("A's late write, the lock never lost, returned %v; want it committed", err)
		}
		c := proxy.counters()
		if c.held == 0 || c.flushed != c.held || c.pending != 0 || c.forwarded <= before.forwarded+c.flushed {
			t.Fatalf("proxy %+v (before %+v): want the held bytes flushed and the rest of A's transaction forwarded", c, before)
		}
		if st := netscLoad(t, ctx, store); st.Token != netscTokA || st.Position != 1 {
			t.Fatalf("fence %+v, want %s @1", st, netscTokA)
		}
		if got := netscRows(t, ctx, pool, "netsc_writes"); !netscSameRows(got, netscRow{1, "A", netscTokA}) {
			t.Fatalf("writes %v, want A's late write", got)
		}
	})

	t.Run("b_lease_expired", func(t *testing.T) {
		ctx := testenv.Context(t, 2*time.Minute)
		pool, store, schema := netscPG(t, ctx)
		proxy := netscNewProxy(t, netscUpstream(t))
		sinkA, err := pgfence.New(netscConnect(t, ctx, schema, proxy.addr()))
		if err != nil {
			t.Fatal(err)
		}
		// The hold starts before A's first byte (its BEGIN), so none of A's transaction
		// reaches the server before B's takeover: in particular not its fence advance, which
		// would lock the fence row and make B wait (that order is variant c).
		//
		// A's delayed batch ends at position 2; B's first batch after the takeover ends at 1,
		// so A's write is beyond B's position and only the token can refuse it.
		before := proxy.counters()
		proxy.hold()
		done := make(chan error, 1)
		go func() { done <- sinkA.Apply(ctx, netscKey, netscTokA, 2, 2, netscInsert("A", netscTokA, 2, nil)) }()
		netscWaitFor(t, "A's first bytes held", time.Minute, func() bool { return proxy.counters().held > 0 })

		// A's lease expires; B claims with 0.6 over its own connection and writes.
		st, err := store.Claim(ctx, netscKey, netscTokB, "test")
		if err != nil || st.Token != netscTokB || st.Position != fence.NoPosition {
			t.Fatalf("B's claim: %+v, %v", st, err)
		}
		if err := store.Apply(ctx, netscKey, netscTokB, 1, 1, netscInsert("B", netscTokB, 1, nil)); err != nil {
			t.Fatalf("B's write: %v", err)
		}
		if c := proxy.counters(); c.forwarded != before.forwarded {
			t.Fatalf("%d bytes of A's transaction reached the server before B's takeover", c.forwarded-before.forwarded)
		}

		// The delayed write arrives.
		if err := proxy.release(); err != nil {
			t.Fatal(err)
		}
		err = <-done
		var se *fence.StaleError
		if !errors.As(err, &se) || se.Presented != netscTokA || se.Stored != netscTokB {
			t.Fatalf("A's delayed write returned %v; want *fence.StaleError presenting %s against %s", err, netscTokA, netscTokB)
		}
		// A's bytes were held, then delivered, and the server answered them: the statements
		// after BEGIN (the fence advance that refused) were sent only after the BEGIN reply.
		c := proxy.counters()
		if c.held == 0 || c.flushed != c.held || c.pending != 0 || c.forwarded <= before.forwarded+c.flushed {
			t.Fatalf("proxy %+v (before %+v): want A's held bytes delivered and its refused advance sent after them", c, before)
		}
		if st := netscLoad(t, ctx, store); st.Token != netscTokB || st.Position != 1 {
			t.Fatalf("fence %+v, want %s @1", st, netscTokB)
		}
		if got := netscRows(t, ctx, pool, "netsc_writes"); !netscSameRows(got, netscRow{1, "B", netscTokB}) {
			t.Fatalf("writes %v, want only B's (A's refused write must not be visible)", got)
		}
	})

	t.Run("c_advanced_then_delayed", func(t *testing.T) {
		ctx := testenv.Context(t, 2*time.Minute)
		pool, store, schema := netscPG(t, ctx)
		proxy := netscNewProxy(t, netscUpstream(t))
		connA := netscConnect(t, ctx, schema, proxy.addr())
		pidA := netscPid(t, ctx, connA)
		sinkA, err := pgfence.New(connA)
		if err != nil {
			t.Fatal(err)
		}
		// The delay starts inside A's transaction, after its fence advance was answered: the
		// fence row is locked by A's open transaction and A's user write is what is held.
		done := make(chan error, 1)
		go func() {
			done <- sinkA.Apply(ctx, netscKey, netscTokA, 1, 1, netscInsert("A", netscTokA, 1, proxy.hold))
		}()
		netscWaitFor(t, "A's user write held", time.Minute, func() bool { return proxy.counters().held > 0 })

		connB := netscConnect(t, ctx, schema, nil)
		pidB := netscPid(t, ctx, connB)
		sinkB, err := pgfence.New(connB)
		if err != nil {
			t.Fatal(err)
		}
		type claimed struct {
			st  fence.State
			err error
		}
		claimDone := make(chan claimed, 1)
		go func() {
			st, err := sinkB.Claim(ctx, netscKey, netscTokB, "test")
			claimDone <- claimed{st, err}
		}()
		// B's claim is blocked by A's backend on the fence row, as the server reports.
		netscWaitFor(t, "B's claim waiting on A's lock", time.Minute, func() bool {
			var blocked bool
			if err := pool.QueryRow(ctx, `SELECT $2::int = ANY(pg_blocking_pids($1))`, pidB, pidA).Scan(&blocked); err != nil {
				t.Fatal(err)
			}
			return blocked
		})
		select {
		case c := <-claimDone:
			t.Fatalf("B's claim returned (%+v, %v) while A's transaction held the fence", c.st, c.err)
		default:
		}

		if err := proxy.release(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("A's write, which passed the fence before the delay, returned %v; want it committed", err)
		}
		c := <-claimDone
		if c.err != nil || c.st.Token != netscTokB || c.st.Position != 1 {
			t.Fatalf("B's claim: %+v, %v; want %s resuming after A's position 1", c.st, c.err, netscTokB)
		}
		if err := sinkB.Apply(ctx, netscKey, netscTokB, c.st.Position+1, c.st.Position+1, netscInsert("B", netscTokB, c.st.Position+1, nil)); err != nil {
			t.Fatalf("B's write: %v", err)
		}
		if p := proxy.counters(); p.held == 0 || p.flushed != p.held {
			t.Fatalf("proxy %+v: want A's held bytes delivered", p)
		}
		// Nothing lost, nothing doubled: A's batch then B's, in token order.
		if got := netscRows(t, ctx, pool, "netsc_writes"); !netscSameRows(got, netscRow{1, "A", netscTokA}, netscRow{2, "B", netscTokB}) {
			t.Fatalf("writes %v, want A@1 then B@2", got)
		}
		if st := netscLoad(t, ctx, store); st.Token != netscTokB || st.Position != 2 {
			t.Fatalf("fence %+v, want %s @2", st, netscTokB)
		}
	})
}

// netscSink wraps the PostgreSQL store for one consumer member: it records the member's
// successful claims and its stale refusals, and can hold one Apply at a gate (the first one,
// of any partition or of one, after arm).
//
// The gate holds the Apply BEFORE it reaches the database, not inside the fenced
// transaction: a transaction that has already advanced the fence holds the fence row until it
// ends, so the successor's claim would wait for it (by design: DESIGN.md, "A paused
// transaction that already passed the fence"), the takeover could not happen while the gate
// is closed, and the held batch would commit legitimately first. Holding the batch between
// "decided to write" and "the write reaches the database" is the zombie of Scenario 4: a write
// queued toward storage while the session expires.
type netscSink struct {
	fence.Sink[pgx.Tx]

	mu     sync.Mutex
	claims []netscClaim
	stale  []*fence.StaleError
	armed  bool
	armFor int32      // the partition whose Apply is held; -1 for any
	held   netscClaim // key, token and position of the held Apply

	entered  chan struct{} // closed when the held Apply reaches the gate
	gate     chan struct{} // closed to let it through
	openOnce sync.Once
	result   chan error // the held Apply's outcome
}

type netscClaim struct {
	Key      fence.Key
	Token    fence.Token
	Position int64
}

func netscNewSink(s fence.Sink[pgx.Tx]) *netscSink {
	return &netscSink{Sink: s, entered: make(chan struct{}), gate: make(chan struct{}), result: make(chan error, 1)}
}

func (s *netscSink) arm(p int32) { s.mu.Lock(); s.armed, s.armFor = true, p; s.mu.Unlock() }

func (s *netscSink) open() { s.openOnce.Do(func() { close(s.gate) }) }

func (s *netscSink) Claim(ctx context.Context, k fence.Key, t fence.Token, claimant string) (fence.State, error) {
	st, err := s.Sink.Claim(ctx, k, t, claimant)
	if err == nil {
		s.mu.Lock()
		s.claims = append(s.claims, netscClaim{k, t, st.Position})
		s.mu.Unlock()
	}
	return st, err
}

func (s *netscSink) Apply(ctx context.Context, k fence.Key, t fence.Token, first, pos int64, fn func(context.Context, pgx.Tx) error) error {
	s.mu.Lock()
	held := s.armed && (s.armFor < 0 || s.armFor == k.Partition)
	if held {
		s.armed = false
	}
	if held {
		s.held = netscClaim{k, t, pos}
	}
	s.mu.Unlock()
	var err error
	if held {
		close(s.entered)
		<-s.gate
		// A partitioned process does not see its cancellation either: the queued write goes
		// to the database whatever happened to the member meanwhile.
		err = s.Sink.Apply(context.WithoutCancel(ctx), k, t, first, pos, fn)
		s.result <- err
	} else {
		err = s.Sink.Apply(ctx, k, t, first, pos, fn)
	}
	var se *fence.StaleError
	if errors.As(err, &se) {
		s.mu.Lock()
		s.stale = append(s.stale, se)
		s.mu.Unlock()
	}
	return err
}

func (s *netscSink) snapshot() (claims []netscClaim, stale []*fence.StaleError, held netscClaim) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]netscClaim(nil), s.claims...), append([]*fence.StaleError(nil), s.stale...), s.held
}

// netscClaimed returns the last claim of partition p, if any.
func (s *netscSink) claimed(p int32) (netscClaim, bool) {
	claims, _, _ := s.snapshot()
	for i := len(claims) - 1; i >= 0; i-- {
		if claims[i].Key.Partition == p {
			return claims[i], true
		}
	}
	return netscClaim{}, false
}

// netscFold is the members' handler: it folds each key's sequence numbers into (count, last)
// and logs every batch (partition, token, offsets) in the same fenced transaction.
func netscFold(context.Context, fence.Key, fence.Token) (consumer.Handler[pgx.Tx], error) {
	return consumer.Handler[pgx.Tx](func(ctx context.Context, tx pgx.Tx, b *consumer.Batch) error {
		var batch pgx.Batch
		for _, r := range b.Records {
			seq, err := strconv.ParseInt(string(r.Value), 10, 64)
			if err != nil {
				return consumer.Permanent(err)
			}
			batch.Queue(`INSERT INTO netsc_kv VALUES ($1, 1, $2) ON CONFLICT (key) DO UPDATE
				SET count = netsc_kv.count + 1, last = excluded.last,
				    gaps = netsc_kv.gaps + CASE WHEN excluded.last = netsc_kv.last + 1 THEN 0 ELSE 1 END`, string(r.Key), seq)
		}
		batch.Queue(`INSERT INTO netsc_batches VALUES ($1, $2, $3, $4, $5)`, b.Key.Partition, b.Token.Era, b.Token.Epoch,
			b.Records[0].Offset, b.Records[len(b.Records)-1].Offset)
		return tx.SendBatch(ctx, &batch).Close()
	}), nil
}

const netscKafkaDDL = `
CREATE TABLE netsc_kv (key text PRIMARY KEY, count bigint NOT NULL, last bigint NOT NULL, gaps bigint NOT NULL DEFAULT 0);
CREATE TABLE netsc_batches (partition int NOT NULL, era bigint NOT NULL, epoch bigint NOT NULL, first bigint NOT NULL, last bigint NOT NULL)`

// netscKafka are member settings for quick session expiry on the real broker (its
// group.min.session.timeout.ms is 1000, deploy/local/kafka.sh).
func netscKafka(brokers []string) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(brokers...),
		kgo.FetchMaxWait(200 * time.Millisecond),
		kgo.SessionTimeout(3 * time.Second),
		kgo.HeartbeatInterval(300 * time.Millisecond),
		kgo.RebalanceTimeout(6 * time.Second),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	}
}

// netscProduce writes sequence numbers from..to for each of keys keys, key i to partition
// i%2, in order.
func netscProduce(t *testing.T, ctx context.Context, brokers []string, topic string, keys, from, to int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	for s := from; s <= to; s++ {
		for k := 0; k < keys; k++ {
			recs = append(recs, &kgo.Record{Key: []byte("k" + strconv.Itoa(k)), Value: []byte(strconv.Itoa(s)), Partition: int32(k % 2)})
		}
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

func netscApplied(t *testing.T, ctx context.Context, pool *pgxpool.Pool) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(count), 0) FROM netsc_kv`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// netscMember runs a consumer until stop; stop cancels it and returns Run's error.
type netscMember struct {
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

func netscStart(t *testing.T, c *consumer.Consumer[pgx.Tx]) *netscMember {
	ctx, cancel := context.WithCancel(context.Background())
	m := &netscMember{cancel: cancel, done: make(chan error, 1)}
	go func() { m.done <- c.Run(ctx) }()
	t.Cleanup(func() { _ = m.stop() })
	return m
}

func (m *netscMember) stop() error {
	m.once.Do(func() { m.cancel(); m.err = <-m.done })
	return m.err
}

// netscMeter reads a member's counters (OpenTelemetry SDK, manual reader).
type netscMeter struct {
	*sdkmetric.MeterProvider
	r *sdkmetric.ManualReader
}

func netscNewMeter() *netscMeter {
	r := sdkmetric.NewManualReader()
	return &netscMeter{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(r)), r: r}
}

// sum totals an Int64 counter, over data points whose baton.outcome is outcome (any if "").
func (m *netscMeter) sum(t *testing.T, name, outcome string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := m.r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			s, ok := mt.Data.(metricdata.Sum[int64])
			if mt.Name != name || !ok {
				continue
			}
			for _, dp := range s.DataPoints {
				if v, _ := dp.Attributes.Value("baton.outcome"); outcome == "" || v.AsString() == outcome {
					total += dp.Value
				}
			}
		}
	}
	return total
}

var netscQuiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// Scenario 4 (session expiry during a partition): two members over the real broker and the
// real PostgreSQL share a 2-partition topic. Member A has a batch queued toward the database
// when its network to Kafka is cut. After the session timeout the coordinator expires A's
// session (A is no longer a member) and B claims A's partition with a higher generation.
// A's queued write then reaches the database, between B's claim and B's first write, beyond
// the stored position: the token alone refuses it, and none of it is visible. B goes on and
// applies everything, each record exactly once. When the partition heals, A learns it lost
// the partition (OnPartitionsLost), and its Run returns cleanly on cancel.
func TestScenario4SessionExpiryDuringPartition(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	pool, _ := testenv.Postgres(t)
	ctx := testenv.Context(t, 5*time.Minute)
	if _, err := pool.Exec(ctx, netscKafkaDDL); err != nil {
		t.Fatal(err)
	}
	store, err := pgfence.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	topic := testenv.NewTopic(t, brokers, 2)
	group := testenv.UniqueName("g")
	const keys, n1, n2, n = 8, 3, 5, 8 // sequences 1..n1, then n1+1..n2 (A's held batch), then ..n

	fz := netfreeze.New()
	sinkA, sinkB := netscNewSink(store), netscNewSink(store)
	mA := netscNewMeter()
	a, err := consumer.New(group, []string{topic}, fence.Sink[pgx.Tx](sinkA), nil, consumer.PerPartition(netscFold),
		consumer.Kafka(append(netscKafka(brokers), kgo.Dialer(fz.Dial), kgo.RequestTimeoutOverhead(time.Second))...),
		consumer.Logger(netscQuiet), consumer.Telemetry(mA, nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	runA := netscStart(t, a)
	// Registered after runA's cleanup, so it runs first: a failed test never leaves A blocked.
	t.Cleanup(func() { fz.Thaw(); sinkA.open() })

	netscProduce(t, ctx, brokers, topic, keys, 1, n1)
	netscWaitFor(t, "A applies the first records", 2*time.Minute, func() bool { return netscApplied(t, ctx, pool) >= keys*n1 })

	b, err := consumer.New(group, []string{topic}, fence.Sink[pgx.Tx](sinkB), nil, consumer.PerPartition(netscFold),
		consumer.Kafka(netscKafka(brokers)...), consumer.Logger(netscQuiet))
	if err != nil {
		t.Fatal(err)
	}
	runB := netscStart(t, b)
	t.Cleanup(sinkB.open)
	// B's claim runs in its assignment callback, after A revoked that partition (cooperative
	// rebalancing): from then on A owns exactly the other one.
	var bFirst netscClaim
	netscWaitFor(t, "B claims one partition", 2*time.Minute, func() bool {
		claims, _, _ := sinkB.snapshot()
		if len(claims) > 0 {
			bFirst = claims[0]
		}
		return len(claims) > 0
	})
	pA := 1 - bFirst.Key.Partition
	keyA := fence.Key{Group: group, Topic: topic, Partition: pA}
	before, err := store.Load(ctx, keyA)
	if err != nil {
		t.Fatal(err)
	}

	// A's next batch is held before it reaches the database; then A's Kafka network is cut.
	sinkA.arm(-1)
	netscProduce(t, ctx, brokers, topic, keys, n1+1, n2)
	select {
	case <-sinkA.entered:
	case <-ctx.Done():
		t.Fatal("A never started its batch")
	}
	fz.Freeze()
	_, _, held := sinkA.snapshot()
	if held.Key != keyA {
		t.Fatalf("A's held batch is for %s, want %s (B owns partition %d)", held.Key, keyA, bFirst.Key.Partition)
	}
	if st, err := store.Load(ctx, keyA); err != nil || st != before {
		t.Fatalf("the held batch reached the database: fence %+v (before %+v), %v", st, before, err)
	}

	// The session expires; B takes A's partition over with a higher generation. B's first
	// write there is held at its gate too, so that A's queued write arrives between B's claim
	// and B's first write: A's batch then lies beyond the stored position, and only the token
	// can refuse it.
	sinkB.arm(pA)
	var takeover netscClaim
	netscWaitFor(t, "B takes over A's partition", 2*time.Minute, func() bool {
		c, ok := sinkB.claimed(pA)
		takeover = c
		return ok
	})
	if held.Token.Compare(takeover.Token) >= 0 || takeover.Position != before.Position {
		t.Fatalf("B claimed %s at %s resuming @%d; want a token above A's %s, resuming at A's last commit @%d",
			keyA, takeover.Token, takeover.Position, held.Token, before.Position)
	}
	// The coordinator agrees: A is no longer a member.
	adm, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	groups, err := kadm.NewClient(adm).DescribeGroups(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	if g := groups[group]; g.Err != nil || len(g.Members) != 1 {
		t.Fatalf("group %s after the takeover: %d members (%v), want only B", group, len(g.Members), g.Err)
	}
	select {
	case <-sinkB.entered:
	case <-ctx.Done():
		t.Fatal("B never started its first batch of A's partition")
	}

	// The partition is still there, but A's queued write reaches the database now.
	sinkA.open()
	err = <-sinkA.result
	var se *fence.StaleError
	if !errors.As(err, &se) || se.Presented != held.Token || se.Stored != takeover.Token {
		t.Fatalf("A's queued write returned %v; want *fence.StaleError presenting %s against B's %s", err, held.Token, takeover.Token)
	}
	if st, err := store.Load(ctx, keyA); err != nil || st.Token != takeover.Token || st.Position != before.Position || held.Position <= st.Position {
		t.Fatalf("fence of %s after A's refusal: %+v, %v; want B's %s at A's last commit @%d, below A's batch end %d",
			keyA, st, err, takeover.Token, before.Position, held.Position)
	}
	t.Logf("A held a batch for %s under %s up to offset %d; B took over with %s resuming @%d; A's write: %v",
		keyA, held.Token, held.Position, takeover.Token, takeover.Position, err)

	// B's held write goes on, and B applies everything.
	sinkB.open()
	if err := <-sinkB.result; err != nil {
		t.Fatalf("B's first write of %s: %v", keyA, err)
	}
	netscProduce(t, ctx, brokers, topic, keys, n2+1, n)
	netscWaitFor(t, "B applies everything", 2*time.Minute, func() bool { return netscApplied(t, ctx, pool) >= keys*n })
	var zombie int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM netsc_batches WHERE partition = $1 AND era = $2 AND epoch = $3 AND last > $4`,
		pA, held.Token.Era, held.Token.Epoch, before.Position).Scan(&zombie); err != nil {
		t.Fatal(err)
	}
	if zombie != 0 {
		t.Fatalf("%d batches of A's token after its last legitimate position are visible", zombie)
	}

	// The partition heals: A's coordinator refuses its expired session and A reports the loss.
	fz.Thaw()
	netscWaitFor(t, "A sees OnPartitionsLost", 2*time.Minute, func() bool { return mA.sum(t, "baton.consumer.rebalances", "lost") >= 1 })
	if got := mA.sum(t, "baton.consumer.stale_refusals", ""); got < 1 {
		t.Errorf("A counted %d stale refusals, want its held write", got)
	}
	if err := runA.stop(); err != nil {
		t.Fatalf("A's Run: %v", err)
	}
	if err := runB.stop(); err != nil {
		t.Fatalf("B's Run: %v", err)
	}
	if _, stale, _ := sinkA.snapshot(); len(stale) != 1 {
		t.Errorf("A's sink saw %d stale refusals %v, want exactly its held write", len(stale), stale)
	}

	// Every record applied exactly once, in order, and tokens never go down along a partition.
	var bad, nkeys int
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE count <> $1 OR last <> $1 OR gaps <> 0), count(*) FROM netsc_kv`, n).
		Scan(&bad, &nkeys); err != nil {
		t.Fatal(err)
	}
	if bad != 0 || nkeys != keys {
		t.Fatalf("%d of %d keys differ from the fold of their %d records (%d keys seen)", bad, keys, n, nkeys)
	}
	var regress int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM (
		SELECT era, epoch, lag(era) OVER w AS pera, lag(epoch) OVER w AS pepoch FROM netsc_batches
		WINDOW w AS (PARTITION BY partition ORDER BY first)) x WHERE (era, epoch) < (pera, pepoch)`).Scan(&regress); err != nil {
		t.Fatal(err)
	}
	if regress != 0 {
		t.Fatalf("%d batches committed under a lower token than an earlier one of their partition", regress)
	}
}

// netscAppPool opens a pool on schema whose connections carry application_name app, so that
// exactly its backends can be found in pg_stat_activity.
func netscAppPool(t *testing.T, ctx context.Context, schema, app string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func netscStore(t *testing.T, db pgfence.DB) *pgfence.Store {
	t.Helper()
	s, err := pgfence.New(db)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Scenario 5 (database failover): what Baton covers and what it does not.
//
//	(i)   A crash-restart of the same durable PostgreSQL between B's takeover and A's zombie
//	      write keeps the fence: committed means on disk (fsync, synchronous_commit), and the
//	      zombie is refused on the new connections. Simulated by terminating every backend of
//	      the application's pool and opening a new pool (the shared server itself is not
//	      restarted: other tests use it).
//	(ii)  A failover to a replica that lost acknowledged commits is NOT covered: the promoted
//	      copy has the older fence, and the zombie's write is accepted (DESIGN.md, "What Baton
//	      does not cover"; fence/pgfence doc, "Not covered"). Simulated by a second schema
//	      holding a copy of the fence and the data taken before B's takeover.
//	(iii) Because every batch carries its token into the data and the fence row keeps the
//	      highest token, the divergence is detectable on reconciliation: the lost primary's
//	      fence says 0.6 where the promoted copy says 0.5, and the write at that position
//	      differs in token.
func TestScenario5DatabaseFailover(t *testing.T) {
	ctx := testenv.Context(t, 2*time.Minute)
	admin, primary := testenv.Postgres(t)
	_, replica := testenv.Postgres(t)
	app := "netsc5_" + primary

	for setting, ok := range map[string]func(string) bool{
		"fsync":              func(v string) bool { return v == "on" },
		"synchronous_commit": func(v string) bool { return v != "off" },
	} {
		var v string
		if err := admin.QueryRow(ctx, "SHOW "+setting).Scan(&v); err != nil {
			t.Fatal(err)
		}
		if !ok(v) {
			t.Fatalf("%s = %s: a committed fence would not survive a crash of this server; (i) claims durability only for a durable server", setting, v)
		}
	}

	p1 := netscAppPool(t, ctx, primary, app)
	store1 := netscStore(t, p1)
	if err := store1.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p1.Exec(ctx, netscWritesDDL); err != nil {
		t.Fatal(err)
	}
	// A owns the partition with 0.5 and commits its batch at position 1.
	if _, err := store1.Claim(ctx, netscKey, netscTokA, "test"); err != nil {
		t.Fatal(err)
	}
	if err := store1.Apply(ctx, netscKey, netscTokA, 1, 1, netscInsert("A", netscTokA, 1, nil)); err != nil {
		t.Fatal(err)
	}

	// The replica's last state before the primary's next commits: every table copied in one
	// transaction. LIKE ... INCLUDING ALL rather than a bare CREATE TABLE AS, because a physical
	// replica has the primary's constraints too, and the fence's ON CONFLICT needs its key.
	func() {
		tx, err := admin.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		for _, table := range []string{"baton_fences", "baton_fences_recoveries", "baton_fences_keyed", "netsc_writes"} {
			src := pgx.Identifier{primary, table}.Sanitize()
			dst := pgx.Identifier{replica, table}.Sanitize()
			if _, err := tx.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (LIKE %s INCLUDING ALL);
				INSERT INTO %s OVERRIDING SYSTEM VALUE SELECT * FROM %s`, dst, src, dst, src)); err != nil {
				t.Fatalf("copy %s: %v", table, err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}()

	// The takeover, on the primary: B claims with 0.6 and commits position 2. A is now a
	// zombie with a batch ending at position 3: beyond B's position, so only the token can
	// refuse it.
	if st, err := store1.Claim(ctx, netscKey, netscTokB, "test"); err != nil || st.Position != 1 {
		t.Fatalf("B's claim: %+v, %v", st, err)
	}
	if err := store1.Apply(ctx, netscKey, netscTokB, 2, 2, netscInsert("B", netscTokB, 2, nil)); err != nil {
		t.Fatal(err)
	}

	t.Run("i_crash_restart_keeps_the_fence", func(t *testing.T) {
		// Every backend of the application's pool is terminated, as a crash would end them.
		var pids []int32
		rows, err := admin.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
		if err != nil {
			t.Fatal(err)
		}
		pids, err = pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			t.Fatal(err)
		}
		var terminated int
		if err := admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
			FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&terminated); err != nil {
			t.Fatal(err)
		}
		if len(pids) == 0 || terminated != len(pids) {
			t.Fatalf("terminated %d of the pool's %d backends %v; the fault did not happen", terminated, len(pids), pids)
		}
		netscWaitFor(t, "the pool's backends gone", time.Minute, func() bool {
			var left int
			if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, pids).Scan(&left); err != nil {
				t.Fatal(err)
			}
			return left == 0
		})
		p1.Close()

		// After the "restart", on new connections: the fence is where B left it.
		p2 := netscAppPool(t, ctx, primary, app)
		store2 := netscStore(t, p2)
		if st := netscLoad(t, ctx, store2); st.Token != netscTokB || st.Position != 2 {
			t.Fatalf("fence after the restart %+v, want %s @2", st, netscTokB)
		}
		err = store2.Apply(ctx, netscKey, netscTokA, 3, 3, netscInsert("A", netscTokA, 3, nil))
		var se *fence.StaleError
		if !errors.As(err, &se) || se.Stored != netscTokB {
			t.Fatalf("A's zombie write after the restart returned %v; want *fence.StaleError against %s", err, netscTokB)
		}
		if got := netscRows(t, ctx, p2, "netsc_writes"); !netscSameRows(got, netscRow{1, "A", netscTokA}, netscRow{2, "B", netscTokB}) {
			t.Fatalf("primary writes %v, want A@1 and B@2", got)
		}
	})

	// "Promote" the replica: the application now points at the copy, which never saw B's
	// claim or write.
	pr := netscAppPool(t, ctx, replica, "netsc5_"+replica)
	storeR := netscStore(t, pr)
	if !t.Run("ii_stale_replica_promoted_accepts_the_zombie", func(t *testing.T) {
		if st := netscLoad(t, ctx, storeR); st.Token != netscTokA || st.Position != 1 {
			t.Fatalf("promoted copy's fence %+v, want %s @1: the copy must predate the takeover", st, netscTokA)
		}
		if err := storeR.Apply(ctx, netscKey, netscTokA, 3, 3, netscInsert("A", netscTokA, 3, nil)); err != nil {
			t.Fatalf("A's zombie write on the promoted stale replica returned %v; this test documents that it is ACCEPTED", err)
		}
		t.Logf("documented limit (DESIGN.md, What Baton does not cover): after a failover to a replica that lost "+
			"acknowledged commits, the zombie's write under %s was accepted; use synchronous replication for fenced data", netscTokA)
		if got := netscRows(t, ctx, pr, "netsc_writes"); !netscSameRows(got, netscRow{1, "A", netscTokA}, netscRow{3, "A", netscTokA}) {
			t.Fatalf("promoted writes %v, want A@1 and the zombie's A@3", got)
		}
	}) {
		return
	}

	t.Run("iii_divergence_detectable", func(t *testing.T) {
		// Reconciliation compares the lost primary with the promoted copy.
		type fenceDiff struct{ lost, promoted fence.Token }
		var d fenceDiff
		var lostPos, promotedPos int64
		err := admin.QueryRow(ctx, fmt.Sprintf(`SELECT p.era, p.epoch, p.position, r.era, r.epoch, r.position
			FROM %s p JOIN %s r USING (group_id, topic, partition)
			WHERE p.group_id = $1 AND p.topic = $2 AND p.partition = $3`,
			pgx.Identifier{primary, "baton_fences"}.Sanitize(), pgx.Identifier{replica, "baton_fences"}.Sanitize()),
			netscKey.Group, netscKey.Topic, netscKey.Partition).
			Scan(&d.lost.Era, &d.lost.Epoch, &lostPos, &d.promoted.Era, &d.promoted.Epoch, &promotedPos)
		if err != nil {
			t.Fatal(err)
		}
		// The promoted copy's fence is further on in position but lower in token than the
		// lost primary's: no single history produces that (tokens never go down along a
		// fence's positions), so the two histories diverged, and the lower token is the
		// zombie's.
		if d.lost != netscTokB || lostPos != 2 || d.promoted != netscTokA || promotedPos != 3 {
			t.Fatalf("fences: lost primary %s @%d, promoted copy %s @%d; want %s @2 vs %s @3",
				d.lost, lostPos, d.promoted, promotedPos, netscTokB, netscTokA)
		}
		// The writes that only one side holds, with the token each was written under.
		p, r := pgx.Identifier{primary, "netsc_writes"}.Sanitize(), pgx.Identifier{replica, "netsc_writes"}.Sanitize()
		rows, err := admin.Query(ctx, fmt.Sprintf(`
			SELECT 'lost', * FROM (SELECT position, writer, era, epoch FROM %[1]s EXCEPT SELECT position, writer, era, epoch FROM %[2]s) x
			UNION ALL
			SELECT 'promoted', * FROM (SELECT position, writer, era, epoch FROM %[2]s EXCEPT SELECT position, writer, era, epoch FROM %[1]s) y
			ORDER BY 1, 2`, p, r))
		if err != nil {
			t.Fatal(err)
		}
		type diverged struct {
			side string
			row  netscRow
		}
		got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (diverged, error) {
			var x diverged
			err := r.Scan(&x.side, &x.row.Position, &x.row.Writer, &x.row.Token.Era, &x.row.Token.Epoch)
			return x, err
		})
		if err != nil {
			t.Fatal(err)
		}
		want := []diverged{{"lost", netscRow{2, "B", netscTokB}}, {"promoted", netscRow{3, "A", netscTokA}}}
		if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
			t.Fatalf("divergent writes %+v, want %+v", got, want)
		}
		// The rule a reconciliation applies: a write on the promoted side under a token below
		// the highest the lost primary accepted is a zombie's.
		if zombie := got[1].row; zombie.Token.Compare(d.lost) >= 0 {
			t.Fatalf("the promoted copy's divergent write %s is not below the lost primary's fence %s", zombie, d.lost)
		}
		t.Logf("reconciliation: the promoted copy holds %s, written under %s, below the %s the lost primary had accepted (its write %s is missing from the copy)",
			got[1].row, got[1].row.Token, d.lost, got[0].row)
	})

	t.Run("iv_window_closes_when_the_owner_writes", func(t *testing.T) {
		// The zombie is accepted on the promoted copy only until the current owner claims
		// there: B's claim restores 0.6 and resumes after the zombie's write. B's batch at 2,
		// acknowledged by the lost primary, is gone: that loss is the failover's, and no fence
		// can repair it.
		if st, err := storeR.Claim(ctx, netscKey, netscTokB, "test"); err != nil || st.Position != 3 {
			t.Fatalf("B's claim on the promoted copy: %+v, %v", st, err)
		}
		if err := storeR.Apply(ctx, netscKey, netscTokA, 4, 4, netscInsert("A", netscTokA, 4, nil)); !errors.Is(err, fence.ErrStale) {
			t.Fatalf("A's next zombie write after B's claim on the promoted copy returned %v, want stale", err)
		}
	})
}
