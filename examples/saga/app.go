package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	_ "modernc.org/sqlite" // the PSP's database in the embedded run

	"github.com/batonhq/baton/consumer/chaos"
)

// Topic suffixes (the harness prefixes them with the run's name). Every record is keyed by
// order id, so one partition of each topic carries all of an order's records of that kind.
const (
	topicOrders          = "orders"           // input: an order was placed (produced by the shop)
	topicStock           = "stock"            // commands to the stock service
	topicPayment         = "payment"          // commands to the payment service
	topicShipping        = "shipping"         // commands to the shipping service
	topicStockReplies    = "stock-replies"    // the stock service's replies
	topicPaymentReplies  = "payment-replies"  // the payment service's replies
	topicShippingReplies = "shipping-replies" // the shipping service's replies
	topicTimeouts        = "timeouts"         // the orchestrator's timeout records, to itself
)

// Saga is the order saga as a chaos application: the orchestrator and the three services run
// in every worker process; the harness produces orders and freezes, kills and restarts the
// workers; Check judges the databases.
type Saga struct {
	StepTimeout time.Duration // how long a step may go unanswered before its timeout record fires

	produced atomic.Int64 // orders produced by this process (the harness's)
	started  time.Time    // when Produce began, for the walk-through's times
	story    string       // the walk-through Check tells
}

var _ chaos.Workload = (*Saga)(nil)

// Name implements chaos.Workload.
func (*Saga) Name() string { return "saga" }

// Topics implements chaos.Workload.
func (*Saga) Topics() []string {
	return []string{topicOrders, topicStock, topicPayment, topicShipping, topicStockReplies, topicPaymentReplies, topicShippingReplies, topicTimeouts}
}

func (s *Saga) stepTimeout() time.Duration {
	if s.StepTimeout <= 0 {
		return 4 * time.Second
	}
	return s.StepTimeout
}

// order is what the shop puts on the orders topic.
type order struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
	// Script says what the world does to this order, so a run covers every path: "ok",
	// "out-of-stock", "declined", "ship-fails", "payment-lost" (the PSP charges but its answer
	// is lost: the step times out) and "ship-hangs" (the carrier never answers: the step times
	// out and the shipment is cancelled).
	Script string `json:"script"`
}

var scripts = []string{"ok", "out-of-stock", "ok", "declined", "ok", "ship-fails", "ok", "payment-lost", "ok", "ship-hangs"}

func orderID(i int64) string { return fmt.Sprintf("o%06d", i) }

// command is what the orchestrator sends a service through the outbox.
type command struct {
	Order  string `json:"order"`
	Kind   string `json:"kind"` // reserve, release, charge, refund, ship, cancel-ship
	Amount int64  `json:"amount,omitempty"`
	Script string `json:"script"`
}

// reply is what a service sends back through its outbox.
type reply struct {
	Order  string `json:"order"`
	Step   string `json:"step"`   // the command kind it answers
	Result string `json:"result"` // reserved, rejected, charged, declined, shipped, ship-failed, cancelled, too-late
}

// timeout is a record the orchestrator sends itself with each step: when it comes due and
// the saga still waits on that step (same attempt), the step has timed out. It is a record,
// not a timer: a takeover cannot lose it.
type timeout struct {
	Order   string `json:"order"`
	Step    string `json:"step"`
	Attempt int64  `json:"attempt"` // the saga's step count when the step began
	DueMS   int64  `json:"due_ms"`
}

// Produce implements chaos.Workload: orders at rate per second until stop.
func (s *Saga) Produce(ctx context.Context, env chaos.Env, cl *kgo.Client, rate int, stop <-chan struct{}) error {
	if rate <= 0 {
		rate = 20
	}
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	topic := env.Topic(topicOrders)
	if s.started.IsZero() {
		s.started = time.Now()
	}
	for i := s.produced.Load(); ; i++ {
		select {
		case <-stop:
			return cl.Flush(ctx)
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		o := order{ID: orderID(i), Amount: 100 + i%50, Script: scripts[i%int64(len(scripts))]}
		v, err := json.Marshal(o)
		if err != nil {
			return err
		}
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte(o.ID), Value: v}).FirstErr(); err != nil {
			return err
		}
		s.produced.Store(i + 1)
	}
}

// Settled implements chaos.Workload: every order produced has reached a terminal state.
func (s *Saga) Settled(ctx context.Context, env chaos.Env) (bool, error) {
	var n int64
	err := env.DB.QueryRow(ctx, `SELECT count(*) FROM saga_orders WHERE state IN ('COMPLETED', 'FAILED')`).Scan(&n)
	return err == nil && n >= s.produced.Load(), err
}

// Migrate implements chaos.Workload: the orchestrator's and the services' tables in the run's
// database, the PSP's ledger in its own.
func (s *Saga) Migrate(ctx context.Context, env chaos.Env) error {
	sqlite := env.SQLitePath != "" // the PSP's database is SQLite too then
	if err := execAll(ctx, env.DB, schema(sqlite)); err != nil {
		return err
	}
	psp, closePSP, err := openPSP(ctx, env)
	if err != nil {
		return err
	}
	defer closePSP()
	return execAll(ctx, psp.db, pspSchema(sqlite))
}

func execAll(ctx context.Context, db chaos.DB, stmts string) error {
	for _, st := range strings.Split(stmts, ";") {
		if strings.TrimSpace(st) == "" {
			continue
		}
		if err := db.Exec(ctx, st); err != nil {
			return fmt.Errorf("saga: migrate: %w", err)
		}
	}
	return nil
}

func serial(sqlite bool) string {
	if sqlite {
		return "INTEGER PRIMARY KEY AUTOINCREMENT"
	}
	return "BIGSERIAL PRIMARY KEY"
}

// schema is the run database's tables: the orchestrator's saga state and log, and each
// service's own state and effects (in a real deployment, four databases).
func schema(sqlite bool) string {
	id := serial(sqlite)
	return `
CREATE TABLE IF NOT EXISTS saga_orders (
	order_id TEXT PRIMARY KEY,
	state TEXT NOT NULL,
	steps BIGINT NOT NULL,
	amount BIGINT NOT NULL,
	script TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS saga_log (
	id ` + id + `,
	order_id TEXT NOT NULL,
	n BIGINT NOT NULL,
	from_state TEXT NOT NULL,
	to_state TEXT NOT NULL,
	event TEXT NOT NULL,
	worker TEXT NOT NULL,
	era BIGINT NOT NULL,
	epoch BIGINT NOT NULL,
	topic TEXT NOT NULL,
	part INTEGER NOT NULL,
	off BIGINT NOT NULL,
	at_ms BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS saga_log_order ON saga_log (order_id, n);
CREATE TABLE IF NOT EXISTS stock_orders (order_id TEXT PRIMARY KEY, status TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS stock_moves (
	id ` + id + `,
	order_id TEXT NOT NULL,
	kind TEXT NOT NULL,
	worker TEXT NOT NULL,
	at_ms BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS pay_orders (order_id TEXT PRIMARY KEY, status TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS ship_orders (order_id TEXT PRIMARY KEY, status TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS shipments (
	id ` + id + `,
	order_id TEXT NOT NULL,
	worker TEXT NOT NULL,
	at_ms BIGINT NOT NULL
)`
}

// pspSchema is the payment provider's ledger: one row per charge or refund it executed. An
// idempotency key, when the caller gives one, makes a repeated call return the first result;
// without one every call moves money.
func pspSchema(sqlite bool) string {
	return `
CREATE TABLE IF NOT EXISTS psp_ledger (
	id ` + serial(sqlite) + `,
	order_id TEXT NOT NULL,
	kind TEXT NOT NULL,
	amount BIGINT NOT NULL,
	idem_key TEXT UNIQUE,
	worker TEXT NOT NULL,
	at_ms BIGINT NOT NULL
)`
}

// psp is the external payment provider, reached outside the payment service's transaction:
// what it did stays done when that transaction rolls back.
type psp struct{ db chaos.DB }

// pspTimeout bounds a call to the PSP, as any call to another service should be: a call that
// cannot finish fails the batch, which is retried (the idempotency key makes that safe). The
// chaos workers' PostgreSQL ends a transaction idle for twice the session timeout (4-6 s in the
// tests' runs), which fails such a batch first; the deadline is for runs without that bound.
const pspTimeout = 10 * time.Second

// openPSP opens the PSP's database: a table of the run's PostgreSQL schema, reached over a
// pool of its own (the payment service calls the PSP inside its transaction, which holds one
// of the run's connections: calls through that same pool could take all of it and wait for
// each other for good), or an SQLite file of its own next to the run's.
func openPSP(ctx context.Context, env chaos.Env) (psp, func(), error) {
	if env.SQLitePath == "" {
		pool, err := pgxpool.New(ctx, env.PostgresURL)
		if err != nil {
			return psp{}, nil, fmt.Errorf("saga: the PSP's database: %w", err)
		}
		return psp{pgDB{pool}}, pool.Close, nil
	}
	abs, err := filepath.Abs(strings.TrimSuffix(env.SQLitePath, ".db") + "-psp.db")
	if err != nil {
		return psp{}, nil, err
	}
	q := url.Values{}
	q.Set("_busy_timeout", "10000")
	q.Set("_journal_mode", "WAL")
	db, err := sql.Open("sqlite", "file://"+abs+"?"+q.Encode())
	if err != nil {
		return psp{}, nil, err
	}
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return psp{}, nil, err
	}
	return psp{chaos.SQLDB(db)}, func() { _ = db.Close() }, nil
}

// pgDB is a pgx pool as a chaos.DB.
type pgDB struct{ p *pgxpool.Pool }

func (d pgDB) Exec(ctx context.Context, q string, args ...any) error {
	_, err := d.p.Exec(ctx, q, args...)
	return err
}

func (d pgDB) Query(ctx context.Context, q string, args ...any) (chaos.Rows, error) {
	return d.p.Query(ctx, q, args...)
}

func (d pgDB) QueryRow(ctx context.Context, q string, args ...any) chaos.Row {
	return d.p.QueryRow(ctx, q, args...)
}

// call moves money: kind is "charge" or "refund". With an idempotency key a repeated call is
// answered from the ledger and moves nothing; without one it moves money again. The call
// outlives a cancelled batch (a request already sent is not taken back) but not pspTimeout.
func (p psp) call(ctx context.Context, orderID, kind string, amount int64, key, worker string) error {
	var k any
	if key != "" {
		k = key
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pspTimeout)
	defer cancel()
	return p.db.Exec(ctx, `INSERT INTO psp_ledger (order_id, kind, amount, idem_key, worker, at_ms) VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (idem_key) DO NOTHING`, orderID, kind, amount, k, worker, time.Now().UnixMilli())
}

// Consumers implements chaos.Workload: the orchestrator (orders; replies and timeouts through the
// inbox) and the three services (their commands through the inbox).
func (s *Saga) Consumers(ctx context.Context, env chaos.Env) ([]chaos.Consumer, func(), error) {
	p, closePSP, err := openPSP(ctx, env)
	if err != nil {
		return nil, nil, err
	}
	o := &orchestrator{env: env, timeout: s.stepTimeout()}
	return []chaos.Consumer{
		{Name: "orchestrator", Topics: []string{topicOrders}, Handler: handler(o.placed)},
		{Name: "orchestrator-events", Topics: []string{topicStockReplies, topicPaymentReplies, topicShippingReplies, topicTimeouts}, Inbox: true, Handler: handler(o.event)},
		{Name: "stock", Topics: []string{topicStock}, Inbox: true, Handler: handler(stockService{env}.handle)},
		{Name: "payment", Topics: []string{topicPayment}, Inbox: true, Handler: handler(paymentService{env, p}.handle)},
		{Name: "shipping", Topics: []string{topicShipping}, Inbox: true, Handler: handler(shippingService{env}.handle)},
	}, closePSP, nil
}
