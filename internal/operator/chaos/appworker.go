package chaos

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/outboxconsumer"
)

// groupName is the run's group name for an application consumer.
func groupName(base, suffix string) string {
	if suffix == "" {
		return base
	}
	return base + "-" + suffix
}

// runConsumers runs fn for each consumer concurrently until ctx ends or one fails; it returns
// the first failure.
func runConsumers(ctx context.Context, cs []AppConsumer, fn func(context.Context, AppConsumer) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, len(cs))
	for _, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(ctx, c); err != nil && ctx.Err() == nil {
				errc <- fmt.Errorf("consumer %q: %w", c.Name, err)
				cancel()
			}
		}()
	}
	wg.Wait()
	close(errc)
	return <-errc
}

// startApp is what a worker does before it runs app's consumers, fenced or not: it checks cfg,
// asks app for its consumers, starts the freezer's watch and opens the producing client. stop
// undoes all of it.
func startApp(ctx context.Context, cfg WorkerConfig, app App, env AppEnv) (cs []AppConsumer, f *freezer, cl *kgo.Client, stop func(), err error) {
	if err := cfg.defaults(); err != nil {
		return nil, nil, nil, nil, err
	}
	cs, release, err := app.Consumers(ctx, env)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if release == nil {
		release = func() {}
	}
	cl, err = kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...), kgo.ProducerLinger(2 * time.Millisecond), kgo.AlwaysRetryEOF()}, cfg.Kafka...)...)
	if err != nil {
		release()
		return nil, nil, nil, nil, err
	}
	f = newFreezer(cfg.ID, env.DB)
	var wg sync.WaitGroup
	wctx, cancel := context.WithCancel(ctx)
	wg.Add(1)
	go func() { defer wg.Done(); f.watch(wctx) }()
	return cs, f, cl, func() { cl.Close(); cancel(); wg.Wait(); release() }, nil
}

// runFencedApp runs app's consumers in this worker as Baton consumers over sink, with the
// harness's fault points and attempt log around every write, messages through box and its
// relay, and records of Inbox consumers admitted through keyed.
func runFencedApp[T any](ctx context.Context, cfg WorkerConfig, app App, env AppEnv, sink fence.Sink[T], keyed fence.KeyedSink[T], adapt func(T) Tx, box Outbox[T]) error {
	cs, f, cl, stop, err := startApp(ctx, cfg, app, env)
	if err != nil {
		return err
	}
	defer stop()
	relay, err := outbox.NewRelay(cl, box)
	if err != nil {
		return err
	}
	hook := relay.AfterCommit()
	wrapped := &attemptSink[T]{Sink: sink, f: f, db: env.DB, id: cfg.ID, wait: &dueTable{}}
	return runConsumers(ctx, cs, func(ctx context.Context, c AppConsumer) error {
		group := groupName(cfg.Group, c.Name)
		var topics []string
		for _, s := range c.Topics {
			topics = append(topics, env.Topic(s))
		}
		var inbox *outbox.Inbox[T]
		if c.Inbox {
			in, err := outbox.NewInbox[T](group, keyed)
			if err != nil {
				return err
			}
			inbox = in
		}
		factory := func(ctx context.Context, k fence.Key, t fence.Token) (consumer.Handler[T], error) {
			handle, err := c.Factory(ctx, k, t)
			if err != nil {
				return nil, err
			}
			var h consumer.Handler[T] = consumer.Handler[T](func(ctx context.Context, tx T, b *consumer.Batch) error {
				ab := &AppBatch{Key: b.Key, Token: b.Token, Records: b.Records, Worker: cfg.ID, fenced: true, batch: b,
					appendf: func(ctx context.Context, msgs ...outbox.Message) error {
						return box.Append(ctx, tx, b.Key, b.Token, msgs...)
					}}
				return handle(ctx, adapt(tx), ab)
			})
			if inbox != nil {
				h = outboxconsumer.Handler(inbox, h)
			}
			return consumer.Handler[T](func(ctx context.Context, tx T, b *consumer.Batch) error {
				if err := h(ctx, tx, b); err != nil {
					wrapped.wait.note(b.Key, err)
					return err
				}
				return logApplied(ctx, adapt(tx), b.Key.Topic, b.Key.Partition, b.Token, cfg.ID, b.Records)
			}), nil
		}
		var admit []consumer.Option
		if inbox != nil { // a record refused for good is dead-lettered with its admission
			admit = append(admit, outboxconsumer.AdmitDeadLetters(inbox))
		}
		cons, err := consumer.New[T](group, topics, withTopics(wrapped, sink), nil, append(admit, consumer.PerPartition(factory),
			consumer.Kafka(cfg.kafkaOpts()...), consumer.Logger(cfg.Logger), groupProtocol(),
			consumer.RetryBackoff(20*time.Millisecond, 250*time.Millisecond), // a timeout record waits for its time
			// The relay's reads and marks are writes too: keep freezes out of them.
			consumer.AfterCommit(func(ctx context.Context, k fence.Key, t fence.Token) error {
				return f.write(func() error { return hook(ctx, k, t) })
			}, 250*time.Millisecond))...)
		if err != nil {
			return err
		}
		return cons.Run(ctx)
	})
}

// runUnfencedApp runs app's consumers on Kafka's assignment alone: each batch in a plain
// transaction (with the same fault points and logs), its messages produced after the commit,
// no inbox, offsets committed after the batch.
func runUnfencedApp(ctx context.Context, cfg WorkerConfig, app App, env AppEnv) error {
	cs, f, prod, stop, err := startApp(ctx, cfg, app, env)
	if err != nil {
		return err
	}
	defer stop()
	return runConsumers(ctx, cs, func(ctx context.Context, c AppConsumer) error {
		return runUnfencedConsumer(ctx, cfg, c, env, f, prod)
	})
}

func runUnfencedConsumer(ctx context.Context, cfg WorkerConfig, c AppConsumer, env AppEnv, f *freezer, prod *kgo.Client) error {
	group := groupName(cfg.Group, c.Name)
	var topics []string
	for _, s := range c.Topics {
		topics = append(topics, env.Topic(s))
	}
	type tp struct {
		topic string
		part  int32
	}
	var mu sync.Mutex // guards gens and handlers: written by the rebalance callback, read by the poll loop
	gens := map[tp]int64{}
	handlers := map[tp]AppHandler{}
	opts := append(cfg.kafkaOpts(),
		kgo.ConsumerGroup(group), kgo.ConsumeTopics(topics...), kgo.DisableAutoCommit(),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.OnPartitionsAssigned(func(_ context.Context, cl *kgo.Client, m map[string][]int32) {
			_, gen := cl.GroupMetadata()
			mu.Lock()
			for t, ps := range m {
				for _, p := range ps {
					gens[tp{t, p}] = int64(gen)
					delete(handlers, tp{t, p}) // a new owner's handler, made at its first batch
				}
			}
			mu.Unlock()
		}),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil
		}
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 {
				return
			}
			mu.Lock()
			tok := fence.Token{Epoch: gens[tp{p.Topic, p.Partition}]}
			handle := handlers[tp{p.Topic, p.Partition}]
			mu.Unlock()
			key := fence.Key{Group: group, Topic: p.Topic, Partition: p.Partition}
			if handle == nil {
				h, err := c.Factory(ctx, key, tok)
				if err != nil {
					cfg.Logger.Warn("unfenced handler factory failed", "topic", p.Topic, "partition", p.Partition, "err", err)
					rewind(cl, p.Topic, p.Partition, p.Records[0].Offset)
					return
				}
				handle = h
				mu.Lock()
				handlers[tp{p.Topic, p.Partition}] = h
				mu.Unlock()
			}
			first, last := p.Records[0].Offset, p.Records[len(p.Records)-1].Offset
			zombie := f.point(ctx, p.Topic, p.Partition, tok, first, last)
			resumed := !zombie && f.resumed(p.Topic, p.Partition, tok)
			actx := ctx
			if zombie {
				actx = context.WithoutCancel(ctx)
			}
			var out []*kgo.Record
			err := f.write(func() error {
				tx, commit, rollback, err := env.DB.Begin(actx)
				if err != nil {
					return err
				}
				out = out[:0]
				b := &AppBatch{Key: key, Token: tok, Records: p.Records, Worker: cfg.ID,
					appendf: func(_ context.Context, msgs ...outbox.Message) error {
						for _, m := range msgs {
							out = append(out, &kgo.Record{Topic: m.Topic, Key: m.Key, Value: m.Value, Headers: m.Headers})
						}
						return nil
					}}
				err = handle(actx, tx, b)
				if err == nil {
					err = logApplied(actx, tx, p.Topic, p.Partition, tok, cfg.ID, p.Records)
				}
				if err != nil {
					_ = rollback(actx)
					return err
				}
				return commit(actx)
			})
			logResult(actx, env.DB, cfg.ID, p.Topic, p.Partition, tok, first, last, zombie, resumed, err)
			switch {
			case errors.Is(err, ErrNotDue):
				rewind(cl, p.Topic, p.Partition, first)
				var nd *NotDueError
				if errors.As(err, &nd) {
					sleep(ctx, min(time.Until(nd.Due), 250*time.Millisecond)) // the poll loop serves every partition
				} else {
					sleep(ctx, 100*time.Millisecond)
				}
				return
			case err != nil && !consumer.IsPermanent(err):
				cfg.Logger.Warn("unfenced write failed", "topic", p.Topic, "partition", p.Partition, "err", err)
				rewind(cl, p.Topic, p.Partition, first) // retry the batch
				return
			}
			// The dual write: the messages go out after the commit; a crash in between loses them.
			if len(out) > 0 {
				if err := prod.ProduceSync(actx, out...).FirstErr(); err != nil {
					cfg.Logger.Warn("unfenced produce failed after the commit", "err", err)
				}
			}
			_ = cl.CommitRecords(ctx, p.Records[len(p.Records)-1])
		})
	}
}
