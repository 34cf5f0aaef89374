package outboxconsumer_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/outboxconsumer"
	"github.com/batonhq/baton/outbox/pgoutbox"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestSecurePipelineRuntimeRole is the application's pipeline with every service secured: the
// sender consumes events and appends commands to the outbox, the relay publishes them from
// AfterCommit, the receiver applies them through the inbox. Kafka is SASL_SSL (SCRAM-SHA-512,
// mutual TLS) as the runtime principal holding only its topics' and groups' ACLs; PostgreSQL is
// verify-full as the runtime role holding only RuntimeGrants and DML on its own table. Every
// command is applied exactly once, and no password reaches the logs.
func TestSecurePipelineRuntimeRole(t *testing.T) {
	t.Parallel()
	ke := testenv.SecureKafka(t)
	sp := testenv.SecurePostgres(t)
	ctx := testenv.Context(t, 2*time.Minute)
	var grants []string
	adminFences := must(pgfence.New(sp.Admin))
	for _, m := range []interface {
		Migrate(context.Context) error
		RuntimeGrants(string) ([]string, error)
	}{adminFences, must(pgoutbox.New(sp.Admin, adminFences))} {
		if err := m.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		grants = append(grants, must(m.RuntimeGrants(sp.RuntimeRole))...)
	}
	if _, err := sp.Admin.Exec(ctx, `CREATE TABLE applied (k text NOT NULL, seq int NOT NULL, PRIMARY KEY (k, seq))`); err != nil {
		t.Fatal(err)
	}
	sp.Grant(t, append(grants, "GRANT SELECT, INSERT ON applied TO "+sp.RuntimeRole))
	fences := must(pgfence.New(sp.Runtime))
	box := must(pgoutbox.New(sp.Runtime, fences))

	events, commands := ke.Topic(t, 2), ke.Topic(t, 2)
	sendGroup, recvGroup := ke.Group(t), ke.Group(t)
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	kopts := func() []kgo.Opt {
		return append(ke.RuntimeOpts(t), kgo.FetchMaxWait(100*time.Millisecond), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.WithLogger(kgo.BasicLogger(&logs, kgo.LogLevelInfo, nil)))
	}
	relayClient, err := kgo.NewClient(kopts()...)
	if err != nil {
		t.Fatal(err)
	}
	defer relayClient.Close()
	relay := must(outbox.NewRelay(relayClient, box))
	sender := must(consumer.New(sendGroup, []string{events}, fence.Sink[pgx.Tx](fences),
		nil, consumer.PerPartition(func(context.Context, fence.Key, fence.Token) (consumer.Handler[pgx.Tx], error) {
			return consumer.Handler[pgx.Tx](func(ctx context.Context, tx pgx.Tx, b *consumer.Batch) error {
				msgs := make([]outbox.Message, 0, len(b.Records))
				for _, r := range b.Records {
					msgs = append(msgs, outbox.Message{Topic: commands, Key: r.Key, Value: r.Value})
				}
				return box.Append(ctx, tx, b.Key, b.Token, msgs...)
			}), nil
		}),
		consumer.Kafka(kopts()...), consumer.Logger(log), consumer.AfterCommit(relay.AfterCommit(), 200*time.Millisecond)))
	inbox := must(outbox.NewInbox[pgx.Tx]("receiver", fences))
	receiver := must(consumer.New(recvGroup, []string{commands}, fence.Sink[pgx.Tx](fences),
		nil, consumer.PerPartition(func(context.Context, fence.Key, fence.Token) (consumer.Handler[pgx.Tx], error) {
			return outboxconsumer.Handler(inbox, consumer.Handler[pgx.Tx](func(ctx context.Context, tx pgx.Tx, b *consumer.Batch) error {
				for _, r := range b.Records {
					if _, err := tx.Exec(ctx, `INSERT INTO applied VALUES ($1, $2)`, string(r.Key), string(r.Value)); err != nil {
						return consumer.Permanent(fmt.Errorf("applied twice: %s/%s: %w", r.Key, r.Value, err))
					}
				}
				return nil
			})), nil
		}),
		consumer.Kafka(kopts()...), consumer.Logger(log)))

	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, c := range []interface{ Run(context.Context) error }{sender, receiver} {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- c.Run(runCtx) }()
	}
	stop := func() {
		cancel()
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	}
	defer func() {
		if runCtx.Err() == nil {
			stop()
		}
	}()

	const keys, perKey = 6, 20
	prod, err := kgo.NewClient(ke.RuntimeOpts(t)...)
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	var rs []*kgo.Record
	for seq := 0; seq < perKey; seq++ {
		for k := 0; k < keys; k++ {
			rs = append(rs, &kgo.Record{Topic: events, Key: []byte(fmt.Sprintf("device-%d", k)), Value: []byte(strconv.Itoa(seq))})
		}
	}
	if err := prod.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	count := func() int {
		var n int
		_ = sp.Runtime.QueryRow(ctx, `SELECT count(*) FROM applied`).Scan(&n)
		return n
	}
	waitUntil(t, ctx, "every command applied", func() bool { return count() == keys*perKey })
	stop()
	if n := count(); n != keys*perKey {
		t.Fatalf("applied %d commands, want %d", n, keys*perKey)
	}
	testenv.NoSecrets(t, "the pipeline's logs", logs.String(), testenv.Secrets(t))
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
