package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer/chaos"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/outbox"
)

// Saga states. RESERVING, CHARGING and SHIPPING wait on a step; CANCELLING waits on the
// shipping service's answer to a cancellation after the shipment timed out (the shipment is
// the pivot: once it may have happened, the saga must learn whether it did before it refunds).
const (
	stateReserving  = "RESERVING"
	stateCharging   = "CHARGING"
	stateShipping   = "SHIPPING"
	stateCancelling = "CANCELLING"
	stateCompleted  = "COMPLETED"
	stateFailed     = "FAILED"
)

// transitions is the state machine: from state, on event, to state. The checker verifies every
// logged transition against it.
var transitions = map[string]map[string]string{
	"": {"placed": stateReserving},
	stateReserving: {
		"reserved": stateCharging, "rejected": stateFailed, "timeout": stateFailed,
	},
	stateCharging: {
		"charged": stateShipping, "declined": stateFailed, "timeout": stateFailed,
	},
	stateShipping: {
		"shipped": stateCompleted, "ship-failed": stateFailed, "timeout": stateCancelling,
	},
	stateCancelling: {
		"shipped": stateCompleted, "too-late": stateCompleted, "ship-failed": stateFailed, "cancelled": stateFailed,
	},
}

// awaits is the step a waiting state's timeout and replies belong to.
var awaits = map[string]string{stateReserving: "reserve", stateCharging: "charge", stateShipping: "ship", stateCancelling: "cancel-ship"}

type orchestrator struct {
	env     chaos.Env
	timeout time.Duration
}

// handler makes a consumer's handler factory from a per-record function: one handler per
// partition and owner, applying the batch's records in order in its transaction.
func handler(fn func(context.Context, chaos.Tx, *chaos.Batch, *kgo.Record) error) func(context.Context, fence.Key, fence.Token) (chaos.Handler, error) {
	return func(context.Context, fence.Key, fence.Token) (chaos.Handler, error) {
		return func(ctx context.Context, tx chaos.Tx, b *chaos.Batch) error {
			for _, r := range b.Records {
				if err := fn(ctx, tx, b, r); err != nil {
					return err
				}
			}
			return nil
		}, nil
	}
}

type saga struct {
	id, state, script string
	steps, amount     int64
}

// load reads an order's saga in tx, locking its row on PostgreSQL (the orchestrator's two
// consumers, orders and events, may touch one order from two partitions; SQLite serializes
// its writers anyway). A missing saga has state "".
func (o *orchestrator) load(ctx context.Context, tx chaos.Tx, id string) (saga, error) {
	q := `SELECT state, steps, amount, script FROM saga_orders WHERE order_id = $1`
	if o.env.SQLitePath == "" { // PostgreSQL
		q += ` FOR UPDATE`
	}
	s := saga{id: id}
	err := tx.QueryRow(ctx, q, id).Scan(&s.state, &s.steps, &s.amount, &s.script)
	if isNoRows(err) {
		return saga{id: id}, nil
	}
	return s, err
}

// placed starts a saga for a new order: RESERVING, with the reserve command and its timeout.
func (o *orchestrator) placed(ctx context.Context, tx chaos.Tx, b *chaos.Batch, r *kgo.Record) error {
	var in order
	if err := json.Unmarshal(r.Value, &in); err != nil || in.ID == "" {
		return b.Fail(r, fmt.Errorf("saga: order %q: %w", r.Value, err))
	}
	s, err := o.load(ctx, tx, in.ID)
	if err != nil || s.state != "" {
		return err // a redelivered order: its saga has begun
	}
	s.amount, s.script = in.Amount, in.Script
	if err := tx.Exec(ctx, `INSERT INTO saga_orders (order_id, state, steps, amount, script) VALUES ($1, '', 0, $2, $3)`, in.ID, in.Amount, in.Script); err != nil {
		return err
	}
	return o.move(ctx, tx, b, r, s, "placed", o.cmd(topicStock, s, "reserve"))
}

// event applies a service's reply or a timeout record to its saga.
func (o *orchestrator) event(ctx context.Context, tx chaos.Tx, b *chaos.Batch, r *kgo.Record) error {
	var id, step, ev string
	attempt := int64(-1)
	if r.Topic == o.env.Topic(topicTimeouts) {
		var t timeout
		if err := json.Unmarshal(r.Value, &t); err != nil {
			return b.Fail(r, err)
		}
		if due := time.UnixMilli(t.DueMS); time.Now().Before(due) {
			return chaos.NotDue(due, fmt.Errorf("saga: timeout of %s %s", t.Order, t.Step))
		}
		id, step, ev, attempt = t.Order, t.Step, "timeout", t.Attempt
	} else {
		var rep reply
		if err := json.Unmarshal(r.Value, &rep); err != nil {
			return b.Fail(r, err)
		}
		id, step, ev = rep.Order, rep.Step, rep.Result
	}
	s, err := o.load(ctx, tx, id)
	if err != nil {
		return err
	}
	// A late or superseded event: the saga no longer waits on that step (or, for a timeout,
	// on that attempt of it). A late ship reply still counts while the cancellation is open.
	waiting := awaits[s.state] == step || s.state == stateCancelling && step == "ship"
	if !waiting || attempt >= 0 && attempt != s.steps || transitions[s.state][ev] == "" {
		return nil
	}
	var msgs []outbox.Message
	to := transitions[s.state][ev]
	switch {
	case to == stateCharging:
		msgs = append(msgs, o.cmd(topicPayment, s, "charge"))
	case to == stateShipping:
		msgs = append(msgs, o.cmd(topicShipping, s, "ship"))
	case to == stateCancelling:
		msgs = append(msgs, o.cmd(topicShipping, s, "cancel-ship"))
	case to == stateFailed:
		// Compensate whatever may have run: the services refund only a charge they made and
		// release only a reservation they hold, and remember the cancellation in case the
		// step's command is still on its way.
		switch s.state {
		case stateReserving:
			if ev == "timeout" {
				msgs = append(msgs, o.cmd(topicStock, s, "release"))
			}
		case stateCharging:
			if ev == "timeout" {
				msgs = append(msgs, o.cmd(topicPayment, s, "refund"))
			}
			msgs = append(msgs, o.cmd(topicStock, s, "release"))
		case stateShipping, stateCancelling:
			msgs = append(msgs, o.cmd(topicPayment, s, "refund"), o.cmd(topicStock, s, "release"))
		}
	}
	return o.move(ctx, tx, b, r, s, ev, msgs...)
}

// move advances saga s on event ev in tx: the new state, one log row, the commands and, for a
// state that waits on a step, that step's timeout record; all in the fenced transaction and
// through the fenced outbox, so a zombie owner can do none of it.
func (o *orchestrator) move(ctx context.Context, tx chaos.Tx, b *chaos.Batch, r *kgo.Record, s saga, ev string, msgs ...outbox.Message) error {
	to := transitions[s.state][ev]
	n := s.steps + 1
	if err := tx.Exec(ctx, `UPDATE saga_orders SET state = $2, steps = $3 WHERE order_id = $1`, s.id, to, n); err != nil {
		return err
	}
	if err := tx.Exec(ctx, `INSERT INTO saga_log (order_id, n, from_state, to_state, event, worker, era, epoch, topic, part, off, at_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`, s.id, n, s.state, to, ev, b.Worker, b.Token.Era, b.Token.Epoch, r.Topic, r.Partition, r.Offset, time.Now().UnixMilli()); err != nil {
		return err
	}
	if step, ok := awaits[to]; ok && to != stateCancelling {
		v, err := json.Marshal(timeout{Order: s.id, Step: step, Attempt: n, DueMS: time.Now().Add(o.timeout).UnixMilli()})
		if err != nil {
			return err
		}
		msgs = append(msgs, outbox.Message{Topic: o.env.Topic(topicTimeouts), Key: []byte(s.id), Value: v})
	}
	return b.Append(ctx, msgs...)
}

func (o *orchestrator) cmd(topic string, s saga, kind string) outbox.Message {
	v, _ := json.Marshal(command{Order: s.id, Kind: kind, Amount: s.amount, Script: s.script}) // cannot fail
	return outbox.Message{Topic: o.env.Topic(topic), Key: []byte(s.id), Value: v}
}

func isNoRows(err error) bool {
	return errors.Is(err, pgx.ErrNoRows) || errors.Is(err, errSQLNoRows)
}
