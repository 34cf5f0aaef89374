package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
)

// gate is a fence.Sink wrapper that holds one Apply (the first after arm) before it reaches
// the store, as if the process paused between deciding to write and writing. When released,
// the held write goes on to the store whatever happened meanwhile: a paused process does not
// notice that its context was cancelled either.
type gate[Tx any] struct {
	fence.Sink[Tx]
	mu       sync.Mutex
	armed    bool
	held     chan struct{} // closed when the write is held
	proceed  chan struct{} // closed to let the held write proceed
	openOnce sync.Once
	result   chan error // the held write's outcome
}

func newGate[Tx any](s fence.Sink[Tx]) *gate[Tx] {
	return &gate[Tx]{Sink: s, held: make(chan struct{}), proceed: make(chan struct{}), result: make(chan error, 1)}
}

func (g *gate[Tx]) arm() { g.mu.Lock(); g.armed = true; g.mu.Unlock() }

func (g *gate[Tx]) Apply(ctx context.Context, k fence.Key, t fence.Token, first, pos int64, fn func(context.Context, Tx) error) error {
	g.mu.Lock()
	hold := g.armed
	g.armed = false
	g.mu.Unlock()
	if !hold {
		return g.Sink.Apply(ctx, k, t, first, pos, fn)
	}
	close(g.held)
	<-g.proceed
	err := g.Sink.Apply(context.WithoutCancel(ctx), k, t, first, pos, fn)
	g.result <- err
	return err
}

// open lets the held write go, if one is held; it is safe to call more than once.
func (g *gate[Tx]) open() { g.openOnce.Do(func() { close(g.proceed) }) }

// release lets the held write go and returns its outcome.
func (g *gate[Tx]) release() error { g.open(); return <-g.result }

// freezer makes a Kafka client's connections stop moving bytes, as SIGSTOP would stop the
// process: no heartbeats, no fetches, so its session expires. Install it with kgo.Dialer.
type freezer struct {
	mu     sync.Mutex
	frozen bool
	thawed chan struct{}
}

func newFreezer() *freezer { return &freezer{thawed: make(chan struct{})} }

func (f *freezer) freeze() { f.mu.Lock(); f.frozen = true; f.mu.Unlock() }

func (f *freezer) thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.frozen {
		f.frozen = false
		close(f.thawed)
		f.thawed = make(chan struct{})
	}
}

func (f *freezer) wait() {
	f.mu.Lock()
	frozen, thawed := f.frozen, f.thawed
	f.mu.Unlock()
	if frozen {
		<-thawed
	}
}

func (f *freezer) dial(ctx context.Context, network, host string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, host)
	if err != nil {
		return nil, err
	}
	return &frozenConn{Conn: c, f: f}, nil
}

type frozenConn struct {
	net.Conn
	f *freezer
}

func (c *frozenConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.f.wait()
	return n, err
}

func (c *frozenConn) Write(b []byte) (int, error) {
	c.f.wait()
	return c.Conn.Write(b)
}

// memLock stands in for Redis when BATON_REDIS_ADDR is not set: the same lease semantics
// (SET NX PX, GET, compare-and-delete), with keys expiring on the wall clock as Redis's do.
type memLock struct {
	mu   sync.Mutex
	keys map[string]memEntry
}

type memEntry struct {
	value   string
	expires time.Time
}

func newMemLock() *memLock { return &memLock{keys: map[string]memEntry{}} }

func (m *memLock) TryAcquire(_ context.Context, key, value string, ttl time.Duration) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.keys[key]; ok && time.Now().Before(e.expires) {
		return false, nil
	}
	m.keys[key] = memEntry{value, time.Now().Add(ttl)}
	return true, nil
}

func (m *memLock) Get(_ context.Context, key string) (string, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.keys[key]
	if !ok || !time.Now().Before(e.expires) {
		return "", false, nil
	}
	return e.value, true, nil
}

func (m *memLock) Release(ctx context.Context, key, value string) error {
	if v, ok, _ := m.Get(ctx, key); !ok || v != value {
		return fmt.Errorf("lock not held")
	}
	m.mu.Lock()
	delete(m.keys, key)
	m.mu.Unlock()
	return nil
}

// syncWriter serializes the lines written by the program's goroutines.
type syncWriter struct {
	mu    sync.Mutex
	w     io.Writer
	quiet bool
}

func (s *syncWriter) say(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.quiet {
		fmt.Fprintf(s.w, format+"\n", args...)
	}
}

// setQuiet drops (or again prints) what say writes: the members' shutdown rebalances are not
// part of the story.
func (s *syncWriter) setQuiet(q bool) { s.mu.Lock(); s.quiet = q; s.mu.Unlock() }

// waitFor polls cond until it holds; the bound only keeps a broken run from hanging.
func waitFor(ctx context.Context, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// member is one running consumer-group member; stop ends it and waits for it.
type member struct {
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func startMember(ctx context.Context, brokers []string, sink fence.Sink[*sql.Tx], f consumer.Factory[*sql.Tx], extra ...kgo.Opt) (*member, error) {
	opts := append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.SessionTimeout(lease), kgo.RebalanceTimeout(lease),
		kgo.HeartbeatInterval(sessionHeartbeat), kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, extra...)
	c, err := consumer.New("lock-to-partition", []string{"deposits"}, sink, nil, consumer.PerPartition(f), consumer.Kafka(opts...),
		consumer.Logger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	m := &member{cancel: cancel, done: make(chan error, 1)}
	go func() { m.done <- c.Run(ctx) }()
	return m, nil
}

func (m *member) stop() { m.once.Do(func() { m.cancel(); <-m.done }) }
