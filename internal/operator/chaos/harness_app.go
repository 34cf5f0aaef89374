package chaos

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// env is the application's view of the run, in the harness's process.
func (h *harness) env() AppEnv {
	return AppEnv{Mode: h.cfg.Mode, DB: h.db, PostgresURL: h.cfg.PostgresURL, SQLitePath: h.cfg.SQLitePath, base: h.cfg.Topic}
}

// runApp is Run for an [App]: the same workers, faults, logs and verdict, with the
// application's topics, consumers, input and invariants.
func (h *harness) runApp(ctx context.Context, cl *kgo.Client) (*Result, error) {
	cfg, app, env := h.cfg, h.app, h.env()
	var topics []string
	for _, s := range app.Topics() {
		t := env.Topic(s)
		rf := int16(1)
		if cfg.KafkaNodes > 1 {
			rf = -1 // the cluster's default: a killed broker loses no partition
		}
		if resp, err := h.adm.CreateTopic(ctx, cfg.Partitions, rf, nil, t); err != nil || resp.Err != nil {
			return nil, fmt.Errorf("chaos: create topic %s: %w", t, errors.Join(err, resp.Err))
		}
		topics = append(topics, t)
	}
	if err := app.Migrate(ctx, env); err != nil {
		return nil, fmt.Errorf("chaos: %s: migrate: %w", app.Name(), err)
	}
	cs, release, err := app.Consumers(ctx, env) // for the names of the groups the workers join
	if err != nil {
		return nil, fmt.Errorf("chaos: %s: consumers: %w", app.Name(), err)
	}
	if release != nil {
		release()
	}
	for _, c := range cs {
		h.groups = append(h.groups, groupName(cfg.Group, c.Name))
	}
	res := &Result{Config: cfg, Started: h.t0}
	if cfg.Watch != nil {
		cfg.Watch(h.db)
	}
	defer h.stopAll()
	finishAudit, err := h.startAudit(ctx)
	if err != nil {
		return nil, err
	}
	defer finishAudit()
	for i := 0; i < cfg.Workers; i++ {
		if err := h.start(ctx); err != nil {
			return nil, err
		}
	}

	prodDone := make(chan error, 1)
	stopProd := make(chan struct{})
	pctx, cancelProd := context.WithCancel(ctx)
	defer cancelProd()
	go func() { prodDone <- app.Produce(pctx, env, cl, cfg.Rate, stopProd) }()

	if h.builtin != nil {
		h.progress("run: mode=%s workers=%d partitions=%d records=%d faults=%d seed=%d", cfg.Mode, cfg.Workers, cfg.Partitions, cfg.Workload.Total(), cfg.NumFaults, cfg.Seed)
	} else {
		h.progress("run: app=%s mode=%s workers=%d partitions=%d faults=%d seed=%d", app.Name(), cfg.Mode, cfg.Workers, cfg.Partitions, cfg.NumFaults, cfg.Seed)
	}
	time.Sleep(2 * cfg.SessionTimeout) // let the groups form and start applying
	if cfg.Overlap > 1 || len(cfg.Replay) > 0 {
		res.Schedule = h.injectScheduled(ctx)
		res.Concurrent, res.MaxInFlight = overlapStats(h.faults)
	} else {
		h.injectAll(ctx)
	}
	close(stopProd)
	if err := <-prodDone; err != nil {
		return nil, fmt.Errorf("chaos: %s: produce: %w", app.Name(), err)
	}
	if h.builtin != nil {
		res.Config.Workload = h.builtin.workload()
		h.progress("produced %d rounds of %d keys: %d records", res.Config.Workload.PerKey, cfg.Workload.Keys, res.Config.Workload.Total())
	} else {
		h.progress("input produced; waiting for the application to settle")
	}
	settleStart := time.Now()
	res.Settled = h.waitSettled(ctx, topics, settleStart.Add(cfg.Settle))
	res.SettleIn = time.Since(settleStart)
	res.Audit = finishAudit()
	if !res.Settled && ctx.Err() == nil { // not a run cancelled while it settled
		h.reportStall(ctx, topics)
	}
	h.stopAll()
	res.Faults = h.faults
	res.acked = h.acks.counts()
	if err := h.mirrorRedis(context.WithoutCancel(ctx)); err != nil {
		return res, err
	}
	if err := h.mirrorShards(context.WithoutCancel(ctx)); err != nil {
		return res, err
	}
	res.Verdict, err = CheckApp(context.WithoutCancel(ctx), env, app)
	res.Finished = time.Now()
	return res, err
}

// injectAll injects the configured faults one after another.
func (h *harness) injectAll(ctx context.Context) {
	cfg := h.cfg
	start := time.Now()
	for i := 0; i < cfg.NumFaults && ctx.Err() == nil; i++ {
		if cfg.For > 0 && time.Since(start) >= cfg.For {
			h.progress("fault injection stopped after %s: %d of %d faults injected", cfg.For, i, cfg.NumFaults)
			break
		}
		kind := cfg.Faults[i%len(cfg.Faults)]
		if i >= len(cfg.Faults) {
			kind = cfg.Faults[h.rng.Intn(len(cfg.Faults))]
		}
		f := h.inject(ctx, kind)
		h.faults = append(h.faults, f)
		h.logFault(ctx, f)
		h.progress("fault %d/%d %-14s %-10s bit=%v %s (%.1fs)", i+1, cfg.NumFaults, f.Kind, f.Target, f.Bit, f.Detail, f.End.Sub(f.Start).Seconds())
	}
}

// waitSettled waits until the application says it settled and every consumed topic is applied
// to its end, twice in a row a second apart (so messages relayed after the first look, such as
// compensations sent by a final transition, are counted too).
func (h *harness) waitSettled(ctx context.Context, topics []string, deadline time.Time) bool {
	stable := 0
	for {
		ok, err := h.app.Settled(ctx, h.env())
		if err == nil && ok {
			ends, err := h.adm.ListEndOffsets(ctx, topics...)
			if err == nil && h.caughtUp(ctx, ends) {
				stable++
			} else {
				stable = 0
			}
		} else {
			stable = 0
		}
		if stable >= 2 {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		sleep(ctx, time.Second)
	}
}
