package chaos

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	engine "github.com/batonhq/baton/internal/operator/chaos"
)

// appName names the workload on the worker command lines the harness builds: one program runs
// one workload.
const appName = "workload"

// app runs a Workload as the harness's application.
type app struct{ w Workload }

var _ engine.App = app{}

func (app) Name() string       { return appName }
func (a app) Topics() []string { return a.w.Topics() }

func (a app) Migrate(ctx context.Context, env engine.AppEnv) error {
	return a.w.Migrate(ctx, wrapEnv(env))
}

func (a app) Consumers(ctx context.Context, env engine.AppEnv) ([]engine.AppConsumer, func(), error) {
	cs, release, err := a.w.Consumers(ctx, wrapEnv(env))
	if err != nil {
		return nil, nil, err
	}
	out := make([]engine.AppConsumer, len(cs))
	for i, c := range cs {
		out[i] = engine.AppConsumer{Name: c.Name, Topics: c.Topics, Inbox: c.Inbox,
			Factory: func(ctx context.Context, k fence.Key, t fence.Token) (engine.AppHandler, error) {
				h, err := c.Handler(ctx, k, t)
				if err != nil {
					return nil, err
				}
				return func(ctx context.Context, tx engine.Tx, b *engine.AppBatch) error {
					return h(ctx, txOf{tx}, &Batch{Key: b.Key, Token: b.Token, Records: b.Records, Worker: b.Worker, b: b})
				}, nil
			}}
	}
	return out, release, nil
}

func (a app) Produce(ctx context.Context, env engine.AppEnv, cl *kgo.Client, rate int, stop <-chan struct{}) error {
	return a.w.Produce(ctx, wrapEnv(env), cl, rate, stop)
}

func (a app) Settled(ctx context.Context, env engine.AppEnv) (bool, error) {
	return a.w.Settled(ctx, wrapEnv(env))
}

func (a app) Check(ctx context.Context, env engine.AppEnv) ([]engine.Invariant, error) {
	is, err := a.w.Check(ctx, wrapEnv(env))
	out := make([]engine.Invariant, len(is))
	for i, v := range is {
		out[i] = engine.Invariant(v)
	}
	return out, err
}

func wrapEnv(e engine.AppEnv) Env {
	return Env{Fenced: e.Mode == engine.Fenced, DB: wrapDB(e.DB), PostgresURL: e.PostgresURL, SQLitePath: e.SQLitePath,
		Worker: e.Worker, base: e.Topic("")}
}

func wrapDB(d engine.DB) DB {
	if d == nil {
		return nil
	}
	return dbOf{d}
}

type txOf struct{ tx engine.Tx }

func (t txOf) Exec(ctx context.Context, q string, args ...any) error {
	return t.tx.Exec(ctx, q, args...)
}
func (t txOf) QueryRow(ctx context.Context, q string, args ...any) Row {
	return t.tx.QueryRow(ctx, q, args...)
}

type dbOf struct{ db engine.DB }

func (d dbOf) Exec(ctx context.Context, q string, args ...any) error {
	return d.db.Exec(ctx, q, args...)
}
func (d dbOf) Query(ctx context.Context, q string, args ...any) (Rows, error) {
	r, err := d.db.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return r, nil
}
func (d dbOf) QueryRow(ctx context.Context, q string, args ...any) Row {
	return d.db.QueryRow(ctx, q, args...)
}
