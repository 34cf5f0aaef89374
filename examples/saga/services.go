package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer/chaos"
	"github.com/batonhq/baton/outbox"
)

var errSQLNoRows = sql.ErrNoRows

// The services apply each command they are given: deduplication is the inbox's job (in
// fenced mode it drops relay copies and zombies' records before the handler sees them), so
// the handlers check only what the business needs, above all whether the order was cancelled
// before its command arrived. Commands of one order come from different orchestrator
// partitions (the order's, a reply's, a timeout's), so a compensation can overtake the step it
// compensates: the service then remembers the cancellation (a tombstone) and refuses the step.

func decodeCommand(b *chaos.Batch, r *kgo.Record) (command, error) {
	var c command
	if err := json.Unmarshal(r.Value, &c); err != nil || c.Order == "" {
		return c, b.Fail(r, fmt.Errorf("saga: command %q: %w", r.Value, err))
	}
	return c, nil
}

func status(ctx context.Context, tx chaos.Tx, table, id string) (string, error) {
	var s string
	err := tx.QueryRow(ctx, `SELECT status FROM `+table+` WHERE order_id = $1`, id).Scan(&s)
	if isNoRows(err) {
		return "", nil
	}
	return s, err
}

func setStatus(ctx context.Context, tx chaos.Tx, table, id, s string) error {
	return tx.Exec(ctx, `INSERT INTO `+table+` (order_id, status) VALUES ($1, $2)
ON CONFLICT (order_id) DO UPDATE SET status = excluded.status`, id, s)
}

func answer(ctx context.Context, env chaos.Env, b *chaos.Batch, topic string, c command, result string) error {
	v, err := json.Marshal(reply{Order: c.Order, Step: c.Kind, Result: result})
	if err != nil {
		return err
	}
	return b.Append(ctx, outbox.Message{Topic: env.Topic(topic), Key: []byte(c.Order), Value: v})
}

// stockService reserves and releases stock.
type stockService struct{ env chaos.Env }

func (s stockService) handle(ctx context.Context, tx chaos.Tx, b *chaos.Batch, r *kgo.Record) error {
	c, err := decodeCommand(b, r)
	if err != nil {
		return err
	}
	st, err := status(ctx, tx, "stock_orders", c.Order)
	if err != nil {
		return err
	}
	switch c.Kind {
	case "reserve":
		switch {
		case st == "cancelled":
			return answer(ctx, s.env, b, topicStockReplies, c, "rejected")
		case c.Script == "out-of-stock":
			if err := setStatus(ctx, tx, "stock_orders", c.Order, "rejected"); err != nil {
				return err
			}
			return answer(ctx, s.env, b, topicStockReplies, c, "rejected")
		}
		if err := tx.Exec(ctx, `INSERT INTO stock_moves (order_id, kind, worker, at_ms) VALUES ($1, 'reserve', $2, $3)`, c.Order, b.Worker, time.Now().UnixMilli()); err != nil {
			return err
		}
		if err := setStatus(ctx, tx, "stock_orders", c.Order, "reserved"); err != nil {
			return err
		}
		return answer(ctx, s.env, b, topicStockReplies, c, "reserved")
	case "release":
		switch st {
		case "reserved":
			if err := tx.Exec(ctx, `INSERT INTO stock_moves (order_id, kind, worker, at_ms) VALUES ($1, 'release', $2, $3)`, c.Order, b.Worker, time.Now().UnixMilli()); err != nil {
				return err
			}
			return setStatus(ctx, tx, "stock_orders", c.Order, "released")
		case "":
			return setStatus(ctx, tx, "stock_orders", c.Order, "cancelled") // the reserve may still come: refuse it
		}
		return nil
	}
	return b.Fail(r, fmt.Errorf("saga: stock command %q", c.Kind))
}

// paymentService charges and refunds through the PSP, an external API that is not idempotent
// by itself: it gets the command's idempotency key (Baton's, from the outbox row that carried
// the command), so a repeated call for the same command (a retried transaction, a takeover
// that re-applies the batch) moves money once. The call happens inside the fenced
// transaction, after the fence accepted this owner: a zombie never reaches it.
type paymentService struct {
	env chaos.Env
	psp psp
}

func (s paymentService) handle(ctx context.Context, tx chaos.Tx, b *chaos.Batch, r *kgo.Record) error {
	c, err := decodeCommand(b, r)
	if err != nil {
		return err
	}
	st, err := status(ctx, tx, "pay_orders", c.Order)
	if err != nil {
		return err
	}
	switch c.Kind {
	case "charge":
		switch {
		case st == "cancelled":
			return answer(ctx, s.env, b, topicPaymentReplies, c, "declined")
		case c.Script == "declined":
			if err := setStatus(ctx, tx, "pay_orders", c.Order, "declined"); err != nil {
				return err
			}
			return answer(ctx, s.env, b, topicPaymentReplies, c, "declined")
		}
		if err := s.psp.call(ctx, c.Order, "charge", c.Amount, b.IdempotencyKey(r), b.Worker); err != nil {
			return err
		}
		if err := setStatus(ctx, tx, "pay_orders", c.Order, "charged"); err != nil {
			return err
		}
		if c.Script == "payment-lost" {
			return nil // the PSP charged, but its answer never reached us: the step will time out
		}
		return answer(ctx, s.env, b, topicPaymentReplies, c, "charged")
	case "refund":
		switch st {
		case "charged":
			if err := s.psp.call(ctx, c.Order, "refund", c.Amount, b.IdempotencyKey(r), b.Worker); err != nil {
				return err
			}
			return setStatus(ctx, tx, "pay_orders", c.Order, "refunded")
		case "":
			return setStatus(ctx, tx, "pay_orders", c.Order, "cancelled") // the charge may still come: refuse it
		}
		return nil
	}
	return b.Fail(r, fmt.Errorf("saga: payment command %q", c.Kind))
}

// shippingService ships, or answers whether a shipment can still be cancelled.
type shippingService struct{ env chaos.Env }

func (s shippingService) handle(ctx context.Context, tx chaos.Tx, b *chaos.Batch, r *kgo.Record) error {
	c, err := decodeCommand(b, r)
	if err != nil {
		return err
	}
	st, err := status(ctx, tx, "ship_orders", c.Order)
	if err != nil {
		return err
	}
	switch c.Kind {
	case "ship":
		switch {
		case st == "cancelled":
			return answer(ctx, s.env, b, topicShippingReplies, c, "ship-failed")
		case c.Script == "ship-fails":
			if err := setStatus(ctx, tx, "ship_orders", c.Order, "failed"); err != nil {
				return err
			}
			return answer(ctx, s.env, b, topicShippingReplies, c, "ship-failed")
		case c.Script == "ship-hangs":
			return setStatus(ctx, tx, "ship_orders", c.Order, "waiting for the carrier") // no answer
		}
		if err := tx.Exec(ctx, `INSERT INTO shipments (order_id, worker, at_ms) VALUES ($1, $2, $3)`, c.Order, b.Worker, time.Now().UnixMilli()); err != nil {
			return err
		}
		if err := setStatus(ctx, tx, "ship_orders", c.Order, "shipped"); err != nil {
			return err
		}
		return answer(ctx, s.env, b, topicShippingReplies, c, "shipped")
	case "cancel-ship":
		if st == "shipped" {
			return answer(ctx, s.env, b, topicShippingReplies, c, "too-late")
		}
		if err := setStatus(ctx, tx, "ship_orders", c.Order, "cancelled"); err != nil {
			return err
		}
		return answer(ctx, s.env, b, topicShippingReplies, c, "cancelled")
	}
	return b.Fail(r, fmt.Errorf("saga: shipping command %q", c.Kind))
}
