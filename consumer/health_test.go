package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
)

// logRecorder keeps the messages of the records logged at ERROR.
type logRecorder struct {
	mu     sync.Mutex
	errors []string
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError {
		l.mu.Lock()
		defer l.mu.Unlock()
		var cause string
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "err" {
				cause = a.Value.String()
			}
			return true
		})
		l.errors = append(l.errors, r.Message+": "+cause)
	}
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

func (l *logRecorder) logged() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.errors...)
}

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// A Run whose broker is unreachable never joins: it logs and counts the cause while it lasts,
// and when its ctx ends it returns ErrNotJoined with that cause instead of nil.
func TestRunNeverJoinedReportsTheCause(t *testing.T) {
	closed, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	closedAddrs := closed.ListenAddrs()
	closed.Close()
	for name, addrs := range map[string][]string{"closed kfake cluster": closedAddrs, "nothing listening": {deadAddr(t)}} {
		t.Run(name, func(t *testing.T) {
			rec, m := &logRecorder{}, newMeter()
			c, err := consumer.New("g", []string{"t"}, newStore(t), nil, consumer.PerPartition(newFolder().factory),
				consumer.Kafka(kgo.SeedBrokers(addrs...), kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond })),
				consumer.Logger(slog.New(rec)), consumer.MeterProvider(m))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
			defer cancel()
			start := time.Now()
			err = c.Run(ctx)
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("Run took %v after its ctx ended", took)
			}
			if !errors.Is(err, consumer.ErrNotJoined) {
				t.Fatalf("Run = %v, want ErrNotJoined", err)
			}
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("Run = %v, want the dial's cause (connection refused)", err)
			}
			if n := m.sum(t, "baton.consumer.client_errors"); n < 1 {
				t.Errorf("client_errors = %d, want at least 1", n)
			}
			logged := rec.logged()
			if len(logged) == 0 || !strings.Contains(logged[0], "refused") {
				t.Errorf("ERROR logs %q, want the dial's cause", logged)
			}
			// Rate-limited: one right away, then at most one per 10s while it lasts.
			if len(logged) > 1 {
				t.Errorf("%d ERROR logs within 1.5s, want 1: %q", len(logged), logged)
			}
		})
	}
}

// A Run that joined and ended with its ctx still returns nil, even though the broker went away
// before (its errors are the shutdown's, not a failure to run).
func TestRunJoinedReturnsNil(t *testing.T) {
	brokers := fakeKafka(t, kfake.SeedTopics(1, "t"))
	m := newMeter()
	c, err := consumer.New("g", []string{"t"}, newStore(t), nil, consumer.PerPartition(newFolder().factory),
		consumer.Kafka(fastKafka(brokers)...), consumer.Logger(quiet), consumer.MeterProvider(m))
	if err != nil {
		t.Fatal(err)
	}
	mb := start(t, c)
	waitFor(t, "the member to claim its partition", 10*time.Second, func() bool { return m.sum(t, "baton.consumer.claims") == 1 })
	if err := mb.stop(); err != nil {
		t.Fatalf("Run = %v, want nil after a joined run", err)
	}
}

// A broker that is reachable but refuses the join: the group error is the cause.
func TestRunNeverJoinedGroupRefused(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"),
		kfake.BrokerConfigs(map[string]string{"group.min.session.timeout.ms": "6000"}))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	rec := &logRecorder{}
	c, err := consumer.New("g", []string{"t"}, newStore(t), nil, consumer.PerPartition(newFolder().factory),
		consumer.Kafka(fastKafka(cluster.ListenAddrs())...), consumer.Logger(slog.New(rec))) // session timeout 3s < 6s
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
	defer cancel()
	err = c.Run(ctx)
	if !errors.Is(err, consumer.ErrNotJoined) || !errors.Is(err, kerr.InvalidSessionTimeout) {
		t.Fatalf("Run = %v, want ErrNotJoined caused by INVALID_SESSION_TIMEOUT", err)
	}
	if logged := rec.logged(); len(logged) == 0 || !strings.Contains(logged[0], "INVALID_SESSION_TIMEOUT") {
		t.Errorf("ERROR logs %q, want the join's cause", logged)
	}
}
