package consumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/memfence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// logEntry is one record a logBook kept: its level, message and attributes as text.
type logEntry struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

// logBook keeps every record logged through it.
type logBook struct {
	mu      sync.Mutex
	entries []logEntry
}

func (l *logBook) Enabled(context.Context, slog.Level) bool { return true }
func (l *logBook) Handle(_ context.Context, r slog.Record) error {
	e := logEntry{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool {
		e.attrs[a.Key] = a.Value.String()
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries = append(l.entries, e)
	return nil
}
func (l *logBook) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logBook) WithGroup(string) slog.Handler      { return l }

// find returns the records at level whose message contains msg.
func (l *logBook) find(level slog.Level, msg string) []logEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []logEntry
	for _, e := range l.entries {
		if e.level == level && strings.Contains(e.msg, msg) {
			out = append(out, e)
		}
	}
	return out
}

// applyFailingSink fails every Apply while failing is set, as a database that is down would.
type applyFailingSink struct {
	fence.Sink[*memfence.Tx]
	failing atomic.Bool
}

func (s *applyFailingSink) Apply(ctx context.Context, k fence.Key, t fence.Token, first, last int64, fn func(context.Context, *memfence.Tx) error) error {
	if s.failing.Load() {
		return fmt.Errorf("apply %s: dial tcp 127.0.0.1:5432: connect: connection refused", k)
	}
	return s.Sink.Apply(ctx, k, t, first, last, fn)
}

// A sink that keeps failing is retried at WARN, then at ERROR once it has failed for longer
// than the bound; the member stays and applies everything when the sink is back.
func TestLastingSinkFailureLogsError(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	store := newStore(t)
	s := &applyFailingSink{Sink: store}
	s.failing.Store(true)
	var book logBook
	c, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](s), nil, consumer.PerPartition(newFolder().factory),
		consumer.Kafka(fastKafka(brokers)...), consumer.Logger(slog.New(&book)),
		consumer.RetryBackoff(20*time.Millisecond, 50*time.Millisecond), consumer.StalledAfter(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	m := start(t, c)
	produce(t, brokers, "orders", 2, 3)
	waitFor(t, "an ERROR for the stalled partition", 30*time.Second, func() bool {
		return len(book.find(slog.LevelError, "kept failing")) > 0
	})
	if len(book.find(slog.LevelWarn, "transient failure")) == 0 {
		t.Error("no WARN before the bound")
	}
	e := book.find(slog.LevelError, "kept failing")[0]
	if !strings.Contains(e.attrs["err"], "connection refused") || e.attrs["op"] != "apply" {
		t.Errorf("the ERROR does not name the step and the cause: %v", e.attrs)
	}
	s.failing.Store(false)
	waitFor(t, "everything applied after the outage", 30*time.Second, allApplied(store, 2, 3))
	if err := m.stop(); err != nil {
		t.Fatal(err)
	}
}

// gate holds every call that passes it until release is closed, as a call waiting for a
// connection its own pool will never free would; entered is closed at the first.
type gate struct {
	entered, release chan struct{}
	once             sync.Once
}

func (g *gate) hold() {
	g.once.Do(func() { close(g.entered) })
	<-g.release // not even the partition's context ends this wait, as context.WithoutCancel would not
}

// blockingSink holds every Apply at its gate.
type blockingSink struct {
	fence.Sink[*memfence.Tx]
	g *gate
}

func (s *blockingSink) Apply(ctx context.Context, k fence.Key, t fence.Token, first, last int64, fn func(context.Context, *memfence.Tx) error) error {
	s.g.hold()
	return s.Sink.Apply(ctx, k, t, first, last, fn)
}

// A call that does not return (a batch's apply, a lane's Prepare) is logged at ERROR once it
// has waited longer than the bound, naming the step, while it still waits: a partition stalled
// by a call that never returns is not silent. The member applies everything once the call
// returns.
func TestCallThatNeverReturnsLogsError(t *testing.T) {
	for _, op := range []string{"apply", "prepare"} {
		t.Run(op, func(t *testing.T) {
			brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
			store := newStore(t)
			g := &gate{entered: make(chan struct{}), release: make(chan struct{})}
			sink, opts := fence.Sink[*memfence.Tx](&blockingSink{Sink: store, g: g}), []consumer.Option(nil)
			if op == "prepare" {
				sink = store
				opts = append(opts, consumer.Lanes(2, func(context.Context, fence.Key, fence.Token, *kgo.Record) (any, error) {
					g.hold()
					return nil, nil
				}))
			}
			var book logBook
			c, err := consumer.New("g", []string{"orders"}, sink, nil, append(opts, consumer.PerPartition(newFolder().factory),
				consumer.Kafka(fastKafka(brokers)...), consumer.Logger(slog.New(&book)),
				consumer.RetryBackoff(20*time.Millisecond, 50*time.Millisecond), consumer.StalledAfter(300*time.Millisecond))...)
			if err != nil {
				t.Fatal(err)
			}
			m := start(t, c)
			released := false
			defer func() {
				if !released {
					close(g.release)
				}
			}()
			produce(t, brokers, "orders", 2, 3)
			select {
			case <-g.entered:
			case <-time.After(30 * time.Second):
				t.Fatalf("no call reached the %s step", op)
			}
			waitFor(t, "an ERROR for the call that has not returned", 5*time.Second, func() bool {
				return len(book.find(slog.LevelError, "has not returned")) > 0
			})
			e := book.find(slog.LevelError, "has not returned")[0]
			if e.attrs["op"] != op || e.attrs["attempt"] != "1" || op == "prepare" && e.attrs["offset"] == "" {
				t.Errorf("the ERROR does not name the step, its attempt (and the record of a Prepare): %v", e.attrs)
			}
			if len(book.find(slog.LevelWarn, "transient failure")) > 0 {
				t.Error("a call that is still waiting was logged as a failure")
			}
			close(g.release)
			released = true
			waitFor(t, "everything applied once the call returned", 30*time.Second, allApplied(store, 2, 3))
			if err := m.stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A missing fence table says what to run.
func TestMissingFenceTableNamesMigrate(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	s := newFailingSink(newStore(t), &sqlStateError{code: "42P01", msg: `relation "baton_fence" does not exist`})
	var book logBook
	c, err := consumer.New("g", []string{"orders"}, fence.Sink[*memfence.Tx](s), nil, consumer.PerPartition(newFolder().factory),
		consumer.Kafka(fastKafka(brokers)...), consumer.Logger(slog.New(&book)),
		consumer.RetryBackoff(20*time.Millisecond, 50*time.Millisecond), consumer.UnusableSinkAfter(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	m := start(t, c)
	waitFor(t, "a retry naming baton migrate", 30*time.Second, func() bool {
		for _, e := range book.find(slog.LevelWarn, "transient failure") {
			if strings.Contains(e.attrs["hint"], "baton migrate") {
				return true
			}
		}
		return false
	})
	select {
	case err := <-m.done:
		m.done <- err
		if !strings.Contains(err.Error(), "baton migrate") {
			t.Errorf("Run's error does not name baton migrate: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not end")
	}
}

// A consumed topic that does not exist is logged at ERROR at once, naming it, and not again
// at every look.
func TestMissingTopicLogsError(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "orders"))
	missingTopic(t, brokers, "g", "orders", "absent", fastKafka(brokers))
}

// The same on the real broker.
func TestRealMissingTopicLogsError(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	missingTopic(t, brokers, testenv.UniqueName("g"), testenv.NewTopic(t, brokers, 1), testenv.UniqueName("absent"), realKafka(brokers))
}

func missingTopic(t *testing.T, brokers []string, group, present, absent string, kafka []kgo.Opt) {
	var book logBook
	c, err := consumer.New(group, []string{present, absent}, fence.Sink[*memfence.Tx](newStore(t)), nil,
		consumer.PerPartition(newFolder().factory), consumer.Kafka(kafka...), consumer.Logger(slog.New(&book)),
		consumer.LagLook(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	start(t, c)
	waitFor(t, "an ERROR naming the missing topic", 30*time.Second, func() bool {
		for _, e := range book.find(slog.LevelError, "topic does not exist") {
			if e.attrs["topic"] == absent {
				return true
			}
		}
		return false
	})
	time.Sleep(500 * time.Millisecond) // ten looks
	if n := len(book.find(slog.LevelError, "topic does not exist")); n != 1 {
		t.Errorf("%d ERRORs for the missing topic in ten looks, want 1", n)
	}
}
