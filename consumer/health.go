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
	attrs   func(kind string) metric.MeasurementOption
	joined  atomic.Bool // ever joined during this Run
	session atomic.Bool // in a group session now: assigned since the last join, not lost since
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
	h.errs.Add(context.Background(), 1, h.attrs(kind))
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

// lastError returns the last client error seen, or nil.
func (h *health) lastError() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
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

// Readiness is a snapshot of how far a member has got into its group, from
// [Consumer.Readiness]: what a readiness probe needs ("joined and claimed").
type Readiness struct {
	// Running: Run has been called and has not returned.
	Running bool
	// Joined: the member is in a group session: franz-go called OnPartitionsAssigned after
	// the member's latest join and sync (even with nothing assigned), and has not reported the
	// session lost (OnPartitionsLost) since.
	Joined bool
	// Assigned is the number of partitions assigned to this member.
	Assigned int
	// Claimed is how many of them completed their fence claim and are being processed: a
	// partition still claiming, or whose claim failed (it then waits, unprocessed, for the
	// next rebalance), is assigned but not claimed.
	Claimed int
	// Cause is the last Kafka client error seen (connect, group management), if any; it
	// explains a member that is not joined.
	Cause error
}

// Ready reports whether the member is running, joined, and has claimed every partition
// assigned to it. A joined member with no partition (more members than partitions) is ready.
func (r Readiness) Ready() bool { return r.Running && r.Joined && r.Claimed == r.Assigned }

// String says in one line why the member is not ready, or that it is.
func (r Readiness) String() string {
	switch {
	case !r.Running:
		return "not running"
	case !r.Joined && r.Cause != nil:
		return "not joined: " + r.Cause.Error()
	case !r.Joined:
		return "not joined"
	case r.Claimed < r.Assigned:
		return fmt.Sprintf("claimed %d of %d assigned partitions", r.Claimed, r.Assigned)
	default:
		return fmt.Sprintf("ready: joined, %d of %d assigned partitions claimed", r.Claimed, r.Assigned)
	}
}

// Readiness reports whether this member has joined its group and claimed every partition
// assigned to it. It is safe to call at any time, from any goroutine: before Run (not
// running), concurrently with it, and after it returned (not running). It takes the lock of
// the partitions' registry briefly and does no I/O.
func (c *Consumer[Tx]) Readiness() Readiness {
	r := c.cur.Load()
	if r == nil {
		return Readiness{}
	}
	return r.readiness()
}

func (r *run[Tx]) readiness() Readiness {
	rd := Readiness{Running: true, Joined: r.health.session.Load(), Cause: r.health.lastError()}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range r.workers {
		if w.removed {
			continue
		}
		rd.Assigned++
		// A claim that failed, or a worker that stopped processing (its factory failed), leaves
		// the partition paused as idle.
		if w.claimDone && w.pause&pauseIdle == 0 {
			rd.Claimed++
		}
	}
	return rd
}
