package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// errorLogEvery bounds how often client errors are logged while they last: the first one at
// once, then at most one per interval, with the count of those not logged.
const errorLogEvery = 10 * time.Second

// health watches one Run's Kafka client through franz-go hooks: failures to connect (dial,
// TLS, SASL) and to manage the group (find the coordinator, join, sync) are counted
// (baton.consumer.client_errors), logged at ERROR at most every errorLogEvery while they
// last, and the last one is kept, so that a Run that never joined the group can say why.
//
// "Joined" means franz-go called OnPartitionsAssigned: it does so after every successful
// JoinGroup and SyncGroup, even when nothing new is assigned.
type health struct {
	log     *slog.Logger
	errs    metric.Int64Counter
	joined  atomic.Bool
	closing atomic.Bool // the client is being closed: its errors are ours

	mu         sync.Mutex
	last       error
	logged     time.Time
	suppressed int
}

var (
	_ kgo.HookBrokerConnect    = (*health)(nil)
	_ kgo.HookGroupManageError = (*health)(nil)
)

func (h *health) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err != nil {
		addr := net.JoinHostPort(meta.Host, strconv.Itoa(int(meta.Port)))
		h.failed("connect", fmt.Errorf("broker %s: %w", addr, err))
	}
}

func (h *health) OnGroupManageError(err error) { h.failed("group", err) }

// failed records err as the latest reason the client cannot work.
func (h *health) failed(kind string, err error) {
	if h.closing.Load() || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, kgo.ErrClientClosed) {
		return
	}
	h.errs.Add(context.Background(), 1, metric.WithAttributes(attribute.String("baton.error.kind", kind)))
	now := time.Now()
	h.mu.Lock()
	h.last = err
	if !h.logged.IsZero() && now.Sub(h.logged) < errorLogEvery {
		h.suppressed++
		h.mu.Unlock()
		return
	}
	n := h.suppressed
	h.logged, h.suppressed = now, 0
	h.mu.Unlock()
	msg := "kafka client error"
	if !h.joined.Load() {
		msg = "cannot reach the Kafka cluster or join the group yet"
	}
	h.log.Error(msg, "kind", kind, "err", err, "joined", h.joined.Load(), "not_logged_since_last", n)
}

// neverJoined returns the error Run reports when its member never joined the group.
func (h *health) neverJoined(group string) error {
	h.mu.Lock()
	last := h.last
	h.mu.Unlock()
	if last == nil {
		return fmt.Errorf("%w %s (no client error seen: the run ended before the join completed)", ErrNotJoined, group)
	}
	return fmt.Errorf("%w %s; last cause: %w", ErrNotJoined, group, last)
}
