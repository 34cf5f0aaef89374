package outboxconsumer_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/outboxconsumer"
	"github.com/batonhq/baton/outbox/pgoutbox"
	"github.com/batonhq/baton/outbox/sqliteoutbox"
)

const (
	relayGroup = "http-relay"
	coordTopic = "outbox-shards"
	// appendAttempts is how many times outbox.AppendCurrent loads a shard's token and appends.
	appendAttempts = 5
)

// spyStore is a relay's view of the outbox store: it remembers, per shard, the tokens under
// which this member read pending rows and the rows it read, and fails its first MarkDelivered
// after publishing (a crash between produce and mark), so that copies are re-published.
type spyStore struct {
	outbox.Store
	mu        sync.Mutex
	tokens    map[int32]map[fence.Token]bool // tokens Pending accepted, per shard
	read      map[int32]int                  // rows Pending returned, per shard
	failedOne bool
}

func newSpy(s outbox.Store) *spyStore {
	return &spyStore{Store: s, tokens: map[int32]map[fence.Token]bool{}, read: map[int32]int{}}
}

func (s *spyStore) Pending(ctx context.Context, src fence.Key, tok fence.Token, limit int) ([]outbox.Row, error) {
	rows, err := s.Store.Pending(ctx, src, tok, limit)
	if err == nil {
		s.mu.Lock()
		if s.tokens[src.Partition] == nil {
			s.tokens[src.Partition] = map[fence.Token]bool{}
		}
		s.tokens[src.Partition][tok] = true
		s.read[src.Partition] += len(rows)
		s.mu.Unlock()
	}
	return rows, err
}

func (s *spyStore) MarkDelivered(ctx context.Context, src fence.Key, tok fence.Token, through int64) (int64, error) {
	s.mu.Lock()
	fail := !s.failedOne
	s.failedOne = true
	s.mu.Unlock()
	if fail {
		return 0, errors.New("injected: crashed between produce and mark")
	}
	return s.Store.MarkDelivered(ctx, src, tok, through)
}

// holds reports whether this member relayed shard under tok.
func (s *spyStore) holds(shard int32, tok fence.Token) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tokens[shard][tok]
}

func (s *spyStore) rowsRead(shard int32) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.read[shard]
}

// member is one process of the standalone relay.
type member struct {
	name    string
	spy     *spyStore
	client  *kgo.Client
	cancel  context.CancelFunc
	done    chan error
	stopped bool
}

// appSide is the application that appends outside any Baton consumer, on one kind of store.
type appSide[Tx any] struct {
	sink  fence.Sink[Tx]
	store outbox.Store
	// event is the application's request handler: one transaction that changes its state
	// for key k and appends msg to shard with AppendCurrent.
	event func(ctx context.Context, shard int32, k string, msg outbox.Message) error
	// appendTo is event for any shard key src (another relay group or coordination topic).
	appendTo func(ctx context.Context, src fence.Key, k string, msg outbox.Message) error
}

// withEvent sets a.event to a.appendTo under ShardKey(relayGroup, coordTopic, shard).
func (a appSide[Tx]) withEvent() appSide[Tx] {
	a.event = func(ctx context.Context, shard int32, k string, msg outbox.Message) error {
		return a.appendTo(ctx, outboxconsumer.ShardKey(relayGroup, coordTopic, shard), k, msg)
	}
	return a
}

func sqliteApp(t *testing.T, ctx context.Context) appSide[*sql.Tx] {
	app, err := sqlitefence.Open(filepath.Join(t.TempDir(), "app.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { app.Close() })
	box, err := sqliteoutbox.New(app)
	if err == nil {
		err = box.Migrate(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := app.DB().ExecContext(ctx, `CREATE TABLE orders (k TEXT PRIMARY KEY, n INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return appSide[*sql.Tx]{sink: app, store: box,
		appendTo: func(ctx context.Context, src fence.Key, k string, msg outbox.Message) error {
			tx, err := app.DB().BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			if _, err := tx.ExecContext(ctx, `INSERT INTO orders (k, n) VALUES (?, 1) ON CONFLICT (k) DO UPDATE SET n = n + 1`, k); err != nil {
				return err
			}
			if _, err := outbox.AppendCurrent(ctx, tx, fence.Sink[*sql.Tx](app), box, src, msg); err != nil {
				return err
			}
			return tx.Commit()
		}}.withEvent()
}

func pgApp(t *testing.T, ctx context.Context) appSide[pgx.Tx] {
	pool, _ := testenv.Postgres(t)
	fences, err := pgfence.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := fences.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	box, err := pgoutbox.New(pool, fences)
	if err != nil {
		t.Fatal(err)
	}
	if err := box.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (k text PRIMARY KEY, n bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return appSide[pgx.Tx]{sink: fences, store: box,
		appendTo: func(ctx context.Context, src fence.Key, k string, msg outbox.Message) error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, `INSERT INTO orders (k, n) VALUES ($1, 1) ON CONFLICT (k) DO UPDATE SET n = orders.n + 1`, k); err != nil {
				return err
			}
			if _, err := outbox.AppendCurrent(ctx, tx, fence.Sink[pgx.Tx](fences), box, src, msg); err != nil {
				return err
			}
			return tx.Commit(ctx)
		}}.withEvent()
}

// TestStandaloneRelayTakeover: an application that is no Baton consumer appends rows to two
// shards with AppendCurrent (some before any relay runs, under the zero token); a standalone
// relay of two members delivers them; the member owning shard 0 is stopped mid-way and the
// other takes shard 0 over and delivers the rest; after a full stop a new member resumes.
// Each member's first mark fails after its publish, so copies are re-published: the topic
// holds every row at least once (more copies than rows, each copy with its row's original
// token), and the receiver, through an inbox, applies every row exactly once in per-key order.
func TestStandaloneRelayTakeover(t *testing.T) {
	ctx := testenv.Context(t, 2*time.Minute)
	testStandaloneTakeover(t, ctx, sqliteApp(t, ctx))
}

// TestStandaloneRelayTakeoverPostgres is the same with the application on PostgreSQL, where
// AppendCurrent's load of the token is not part of the application's transaction.
func TestStandaloneRelayTakeoverPostgres(t *testing.T) {
	ctx := testenv.Context(t, 2*time.Minute)
	testStandaloneTakeover(t, ctx, pgApp(t, ctx))
}

func testStandaloneTakeover[Tx any](t *testing.T, ctx context.Context, app appSide[Tx]) {
	brokers := testenv.FakeKafka(t, kfake.SeedTopics(2, coordTopic), kfake.SeedTopics(3, "commands"),
		kfake.GroupMinSessionTimeout(time.Second))
	dir := t.TempDir()
	if err := outboxconsumer.PrepareShards(ctx, app.sink, relayGroup, coordTopic, 2); err != nil {
		t.Fatal(err)
	}
	const keysPerShard = 3
	next := map[string]int{} // per key: the next value to append
	appended := map[int32]int{}
	appendRows := func(perShard int) {
		t.Helper()
		for i := 0; i < perShard; i++ {
			for shard := int32(0); shard < 2; shard++ {
				k := fmt.Sprintf("s%d-k%d", shard, i%keysPerShard)
				msg := outbox.Message{Topic: "commands", Key: []byte(k), Value: []byte(strconv.Itoa(next[k]))}
				if err := app.event(ctx, shard, k, msg); err != nil {
					t.Fatal(err)
				}
				next[k]++
				appended[shard]++
			}
		}
	}
	appendRows(10) // before any relay: stamped with the zero token, waiting

	// The receiver: a Baton consumer applying commands through an inbox.
	recv, err := sqlitefence.Open(filepath.Join(dir, "receiver.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer recv.Close()
	if _, err := recv.DB().ExecContext(ctx, `CREATE TABLE applied (k TEXT NOT NULL, v INTEGER NOT NULL, PRIMARY KEY (k, v))`); err != nil {
		t.Fatal(err)
	}
	inbox, err := outbox.NewInbox[*sql.Tx]("billing", recv)
	if err != nil {
		t.Fatal(err)
	}
	var doubles atomic.Int64
	kopts := []kgo.Opt{kgo.SeedBrokers(brokers...), kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}
	receiver, err := consumer.New("billing", []string{"commands"}, fence.Sink[*sql.Tx](recv),
		nil, consumer.PerPartition(func(context.Context, fence.Key, fence.Token) (consumer.Handler[*sql.Tx], error) {
			apply := consumer.Handler[*sql.Tx](func(ctx context.Context, tx *sql.Tx, b *consumer.Batch) error {
				for _, r := range b.Records {
					res, err := tx.ExecContext(ctx, `INSERT INTO applied (k, v) VALUES (?, ?) ON CONFLICT DO NOTHING`, string(r.Key), string(r.Value))
					if err != nil {
						return err
					}
					if n, err := res.RowsAffected(); err != nil {
						return err
					} else if n == 0 {
						doubles.Add(1) // already applied: the inbox let a copy through
					}
				}
				return nil
			})
			return outboxconsumer.Handler(inbox, apply), nil
		}), consumer.Kafka(kopts...), consumer.Logger(quiet()))
	if err != nil {
		t.Fatal(err)
	}
	recvCtx, recvCancel := context.WithCancel(ctx)
	recvDone := make(chan error, 1)
	go func() { recvDone <- receiver.Run(recvCtx) }()
	defer func() {
		recvCancel()
		if err := <-recvDone; err != nil {
			t.Errorf("receiver Run: %v", err)
		}
	}()

	// The standalone relay: two members, each with its own client and relay.
	var members []*member
	start := func(name string) *member {
		t.Helper()
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
		if err != nil {
			t.Fatal(err)
		}
		m := &member{name: name, spy: newSpy(app.store), client: cl, done: make(chan error, 1)}
		relay, err := outbox.NewRelay(cl, m.spy, outbox.BatchSize(4))
		if err != nil {
			t.Fatal(err)
		}
		c, err := outboxconsumer.NewStandaloneRelay(relayGroup, coordTopic, app.sink, relay, 50*time.Millisecond,
			consumer.Kafka(kgo.SeedBrokers(brokers...), kgo.ClientID(name)), consumer.Logger(quiet()))
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		m.cancel = cancel
		go func() { m.done <- c.Run(runCtx) }()
		members = append(members, m)
		return m
	}
	stop := func(m *member) {
		t.Helper()
		m.stopped = true
		m.cancel()
		if err := <-m.done; err != nil {
			t.Errorf("%s Run: %v", m.name, err)
		}
		m.client.Close()
	}
	defer func() {
		for _, m := range members {
			if !m.stopped {
				stop(m)
			}
		}
	}()
	start("relay-a")
	start("relay-b")

	applied := func() int {
		var n int
		_ = recv.DB().QueryRowContext(ctx, `SELECT count(*) FROM applied`).Scan(&n)
		return n
	}
	// owner returns the member that relays shard under the token its fence stores now.
	owner := func(shard int32) *member {
		st, err := app.sink.Load(ctx, outboxconsumer.ShardKey(relayGroup, coordTopic, shard))
		if err != nil || st.Token.IsZero() {
			return nil
		}
		for _, m := range members {
			if m.spy.holds(shard, st.Token) {
				return m
			}
		}
		return nil
	}
	waitUntil(t, ctx, "the zero-token rows delivered", func() bool { return applied() == 20 })
	waitUntil(t, ctx, "one shard per member", func() bool {
		o0, o1 := owner(0), owner(1)
		return o0 != nil && o1 != nil && o0 != o1
	})
	appendRows(20)
	waitUntil(t, ctx, "the second phase delivered", func() bool { return applied() == 60 })

	victim, survivor := owner(0), owner(1)
	if victim == nil || survivor == nil || victim == survivor {
		t.Fatalf("shards moved without a member leaving: owners %v, %v", victim, survivor)
	}
	victimTok, err := app.sink.Load(ctx, outboxconsumer.ShardKey(relayGroup, coordTopic, 0))
	if err != nil {
		t.Fatal(err)
	}
	survivorRead := survivor.spy.rowsRead(0)
	// Kill the owner of shard 0 while the application keeps appending.
	victim.cancel()
	appendRows(20)
	stop(victim)
	waitUntil(t, ctx, "every row applied", func() bool { return applied() == 100 })

	st0, err := app.sink.Load(ctx, outboxconsumer.ShardKey(relayGroup, coordTopic, 0))
	if err != nil {
		t.Fatal(err)
	}
	if victimTok.Token.Compare(st0.Token) >= 0 || !survivor.spy.holds(0, st0.Token) {
		t.Fatalf("shard 0 is fenced at %s (victim's token %s); the survivor did not take it over", st0.Token, victimTok.Token)
	}
	if survivor.spy.rowsRead(0) == survivorRead {
		t.Fatal("the survivor relayed no row of shard 0 after the takeover")
	}
	stop(survivor)

	// A long full stop: rows appended while no relay runs wait for the next one, and the
	// empty group is deleted (as Kafka's offsets cleanup does), so the next member starts
	// again at generation 1 and must recover each shard into a new era.
	appendRows(10)
	admCl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	_, err = kadm.NewClient(admCl).DeleteGroup(ctx, relayGroup)
	admCl.Close()
	if err != nil {
		t.Fatalf("deleting the empty relay group: %v", err)
	}
	c := start("relay-c")
	waitUntil(t, ctx, "the rows appended during a full stop delivered", func() bool { return applied() == 120 })
	stop(c)
	for shard := int32(0); shard < 2; shard++ {
		rs, err := app.sink.Recoveries(ctx, outboxconsumer.ShardKey(relayGroup, coordTopic, shard))
		if err != nil || len(rs) != 1 || rs[0].To.Era != rs[0].From.Era+1 {
			t.Fatalf("shard %d recoveries after the group was recreated: %+v, %v; want one era advance", shard, rs, err)
		}
	}
	recvCancel()
	if err := <-recvDone; err != nil {
		t.Errorf("receiver Run: %v", err)
	}
	recvDone <- nil // for the deferred wait

	// Exactly once, in per-key order, at the receiver.
	if n, d := applied(), doubles.Load(); n != 120 || d != 0 {
		t.Fatalf("applied %d commands and %d copies again, want 120 and none", n, d)
	}
	rows, err := recv.DB().QueryContext(ctx, `SELECT k, v FROM applied ORDER BY rowid`)
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]int{}
	for rows.Next() {
		var k string
		var v int
		if err := rows.Scan(&k, &v); err != nil {
			t.Fatal(err)
		}
		if prev, ok := last[k]; (ok && v != prev+1) || (!ok && v != 0) {
			t.Fatalf("key %s: applied %d after %d", k, v, prev)
		}
		last[k] = v
	}
	rows.Close()

	// At least once on the topic: every row, some more than once, each copy with its row's token.
	copies := readAll(t, ctx, brokers, "commands")
	tokens := map[string]fence.Token{} // "source/seq" -> token
	for _, r := range copies {
		env, err := outbox.ParseEnvelope(r)
		if err != nil {
			t.Fatal(err)
		}
		id := env.Source.String() + "/" + strconv.FormatInt(env.Seq, 10)
		if tok, ok := tokens[id]; ok && tok != env.Token {
			t.Fatalf("%s published with tokens %s and %s", id, tok, env.Token)
		}
		tokens[id] = env.Token
	}
	for shard := int32(0); shard < 2; shard++ {
		src := outboxconsumer.ShardKey(relayGroup, coordTopic, shard)
		prev := fence.Token{}
		for seq := 1; seq <= appended[shard]; seq++ {
			tok, ok := tokens[src.String()+"/"+strconv.Itoa(seq)]
			if !ok {
				t.Fatalf("%s seq %d never published", src, seq)
			}
			if seq <= 10 && !tok.IsZero() {
				t.Fatalf("%s seq %d, appended before any relay, has token %s, want the zero token", src, seq, tok)
			}
			if tok.Compare(prev) < 0 {
				t.Fatalf("%s seq %d has token %s, lower than an earlier row's %s", src, seq, tok, prev)
			}
			prev = tok
		}
	}
	if len(tokens) != 120 || len(copies) <= len(tokens) {
		t.Fatalf("%d copies of %d distinct rows; want 120 rows and re-published copies", len(copies), len(tokens))
	}
	t.Logf("%d copies of %d rows on the topic; %d applied", len(copies), len(tokens), applied())
}

// readAll returns every record of topic up to its current end offsets.
func readAll(t *testing.T, ctx context.Context, brokers []string, topic string) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	want := int64(0)
	ends.Each(func(o kadm.ListedOffset) { want += o.Offset })
	var out []*kgo.Record
	for int64(len(out)) < want {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("reading %s: %d of %d records: %v", topic, len(out), want, err)
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Fatalf("reading %s: %v", topic, err) })
		out = append(out, fs.Records()...)
	}
	return out
}

// staleLoads makes Load report an old token a number of times, as if a relay claimed the shard
// between the application's load and its append.
type staleLoads struct {
	fence.Sink[*sql.Tx]
	n int
}

func (s *staleLoads) Load(ctx context.Context, k fence.Key) (fence.State, error) {
	if s.n > 0 {
		s.n--
		return fence.State{Position: fence.NoPosition}, nil
	}
	return s.Sink.Load(ctx, k)
}

// TestAppendCurrent: a shard with no fence row refuses appends until PrepareShards; appends
// then carry the zero token, and after a relay's claim its token; PrepareShards never lowers a
// claimed fence; a claim between load and append is retried within bounds, and nothing is
// written by a refused attempt.
func TestAppendCurrent(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	app, err := sqlitefence.Open(filepath.Join(t.TempDir(), "app.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	box, err := sqliteoutbox.New(app)
	if err == nil {
		err = box.Migrate(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	sink := fence.Sink[*sql.Tx](app)
	src := outboxconsumer.ShardKey(relayGroup, coordTopic, 1)
	msg := outbox.Message{Topic: "commands", Key: []byte("k")}
	// appendOne appends msg in its own transaction through s and commits it on success.
	appendOne := func(s fence.Sink[*sql.Tx]) (fence.Token, error) {
		tx, err := app.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		tok, err := outbox.AppendCurrent(ctx, tx, s, box, src, msg)
		if err == nil {
			err = tx.Commit()
		}
		return tok, err
	}
	backlog := func() int64 {
		n, err := box.Backlog(ctx, src)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	if _, err := appendOne(sink); !errors.Is(err, outbox.ErrUnfenced) {
		t.Fatalf("append to an unprepared shard: %v, want ErrUnfenced", err)
	}
	if err := outboxconsumer.PrepareShards(ctx, sink, relayGroup, coordTopic, 2); err != nil {
		t.Fatal(err)
	}
	if tok, err := appendOne(sink); err != nil || !tok.IsZero() {
		t.Fatalf("append to a prepared shard: %s, %v; want the zero token", tok, err)
	}
	relayTok := fence.Token{Epoch: 3}
	if _, err := app.Claim(ctx, src, relayTok, "test"); err != nil {
		t.Fatal(err)
	}
	if err := outboxconsumer.PrepareShards(ctx, sink, relayGroup, coordTopic, 2); err != nil {
		t.Fatalf("PrepareShards after a relay's claim: %v", err)
	}
	if st, err := app.Load(ctx, src); err != nil || st.Token != relayTok {
		t.Fatalf("after PrepareShards the fence stores %s, %v; want the relay's %s", st.Token, err, relayTok)
	}
	if tok, err := appendOne(sink); err != nil || tok != relayTok {
		t.Fatalf("append after the relay's claim: %s, %v; want %s", tok, err, relayTok)
	}
	if tok, err := appendOne(&staleLoads{Sink: sink, n: appendAttempts - 1}); err != nil || tok != relayTok {
		t.Fatalf("append racing claims: %s, %v; want a retry to succeed under %s", tok, err, relayTok)
	}
	if n := backlog(); n != 3 {
		t.Fatalf("backlog %d, want 3 rows", n)
	}
	if _, err := appendOne(&staleLoads{Sink: sink, n: appendAttempts}); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("append losing every race: %v, want a stale refusal", err)
	}
	if n := backlog(); n != 3 {
		t.Fatalf("backlog %d after a refused append, want 3", n)
	}

	// The rows carry the token they were appended under, in sequence order.
	rows, err := box.Pending(ctx, src, relayTok, 10)
	if err != nil {
		t.Fatal(err)
	}
	want := []fence.Token{{}, relayTok, relayTok}
	for i, r := range rows {
		if r.Seq != int64(i+1) || r.Token != want[i] {
			t.Fatalf("row %d: seq %d token %s, want seq %d token %s", i, r.Seq, r.Token, i+1, want[i])
		}
	}
	if len(rows) != len(want) {
		t.Fatalf("%d pending rows, want %d", len(rows), len(want))
	}
}

func TestNewStandaloneRelayInvalid(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	app, err := sqlitefence.Open(filepath.Join(t.TempDir(), "app.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	box, err := sqliteoutbox.New(app)
	if err == nil {
		err = box.Migrate(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	relay, err := outbox.NewRelay(cl, box)
	if err != nil {
		t.Fatal(err)
	}
	sink := fence.Sink[*sql.Tx](app)
	if _, err := outboxconsumer.NewStandaloneRelay(relayGroup, coordTopic, sink, nil, time.Second); !errors.Is(err, outbox.ErrInvalid) {
		t.Errorf("nil relay: %v, want ErrInvalid", err)
	}
	if _, err := outboxconsumer.NewStandaloneRelay("", coordTopic, sink, relay, time.Second); !errors.Is(err, outbox.ErrInvalid) {
		t.Errorf("empty group: %v, want ErrInvalid", err)
	}
	if _, err := outboxconsumer.NewStandaloneRelay(relayGroup, coordTopic, sink, relay, 0); !errors.Is(err, consumer.ErrInvalidOption) {
		t.Errorf("zero interval: %v, want ErrInvalidOption", err)
	}
	if err := outboxconsumer.PrepareShards(ctx, sink, relayGroup, coordTopic, 0); !errors.Is(err, outbox.ErrInvalid) {
		t.Errorf("PrepareShards of 0 shards: %v, want ErrInvalid", err)
	}
}

// claimFirst is an outbox store whose first Append is preceded by a relay's claim of the shard
// from another connection: the claim lands between AppendCurrent's load and its append.
type claimFirst struct {
	outbox.Appender[pgx.Tx]
	fences *pgfence.Store
	tok    fence.Token
	done   bool
}

func (c *claimFirst) Append(ctx context.Context, tx pgx.Tx, src fence.Key, tok fence.Token, msgs ...outbox.Message) error {
	if !c.done {
		c.done = true
		if _, err := c.fences.Claim(ctx, src, c.tok, "test"); err != nil {
			return err
		}
	}
	return c.Appender.Append(ctx, tx, src, tok, msgs...)
}

// TestAppendCurrentPostgresRace: on PostgreSQL the token is loaded outside the application's
// transaction, so a relay can claim the shard before the append: the append is refused in the
// transaction without aborting it, and the retry appends under the relay's token.
func TestAppendCurrentPostgresRace(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	pool, _ := testenv.Postgres(t)
	fences, err := pgfence.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := fences.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	box, err := pgoutbox.New(pool, fences)
	if err != nil {
		t.Fatal(err)
	}
	if err := box.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	src := outboxconsumer.ShardKey(relayGroup, coordTopic, 0)
	sink := fence.Sink[pgx.Tx](fences)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }() // whichever tx is open when the test ends
	if _, err := outbox.AppendCurrent(ctx, tx, sink, box, src, outbox.Message{Topic: "commands"}); !errors.Is(err, outbox.ErrUnfenced) {
		t.Fatalf("append to an unprepared shard: %v, want ErrUnfenced", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := outboxconsumer.PrepareShards(ctx, sink, relayGroup, coordTopic, 1); err != nil {
		t.Fatal(err)
	}
	relayTok := fence.Token{Epoch: 7}
	if tx, err = pool.Begin(ctx); err != nil {
		t.Fatal(err)
	}
	tok, err := outbox.AppendCurrent(ctx, tx, sink, &claimFirst{Appender: box, fences: fences, tok: relayTok}, src,
		outbox.Message{Topic: "commands", Key: []byte("k")})
	if err != nil || tok != relayTok {
		t.Fatalf("append racing a claim: %s, %v; want a retry under %s", tok, err, relayTok)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := box.Pending(ctx, src, relayTok, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Seq != 1 || rows[0].Token != relayTok {
		t.Fatalf("pending %+v, want one row, seq 1, token %s", rows, relayTok)
	}
}
