package pgoutbox_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/outboxtest"
	"github.com/batonhq/baton/outbox/pgoutbox"
)

// secureStores migrates pgfence and pgoutbox as the migration role on the TLS-only PostgreSQL,
// grants the runtime role what their RuntimeGrants list, and returns both stores working
// through the runtime role's pool (sslmode=verify-full).
func secureStores(t testing.TB, opts ...pgoutbox.Option) (*pgfence.Store, *pgoutbox.Store, *testenv.SecurePG) {
	t.Helper()
	sp := testenv.SecurePostgres(t)
	ctx := testenv.Context(t, time.Minute)
	var grants []string
	adminFences := must(pgfence.New(sp.Admin))
	for _, m := range []interface {
		Migrate(context.Context) error
		RuntimeGrants(string) ([]string, error)
	}{adminFences, must(pgoutbox.New(sp.Admin, adminFences, opts...))} {
		if err := m.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		g, err := m.RuntimeGrants(sp.RuntimeRole)
		if err != nil {
			t.Fatal(err)
		}
		grants = append(grants, g...)
	}
	sp.Grant(t, grants)
	fences := must(pgfence.New(sp.Runtime))
	return fences, must(pgoutbox.New(sp.Runtime, fences, opts...)), sp
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestSecureConformanceRuntimeRole runs the outbox conformance suite as the least-privilege
// runtime role over TLS: RuntimeGrants (pgfence's and pgoutbox's) are all the stores need.
func TestSecureConformanceRuntimeRole(t *testing.T) {
	outboxtest.Run(t, func(t *testing.T) outboxtest.Env[pgx.Tx] {
		fences, store, sp := secureStores(t, pgoutbox.MaxMessageBytes(1000))
		pool := sp.Runtime
		return outboxtest.Env[pgx.Tx]{
			Store: store, Fences: fences, MaxMessageBytes: 1000,
			Begin: func(ctx context.Context) (pgx.Tx, func() error, func() error, error) {
				tx, err := pool.Begin(ctx)
				if err != nil {
					return nil, nil, nil, err
				}
				rollback := func() error {
					rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					return tx.Rollback(rctx)
				}
				return tx, func() error { return tx.Commit(ctx) }, rollback, nil
			},
		}
	})
}

// TestSecureRelayOverSASLSSL: rows appended as the runtime role are relayed over SASL_SSL by the
// runtime principal, which holds only its topic's ACLs, and read back with their headers;
// Cleanup runs as the runtime role too. No password appears in the relay's logs or errors.
func TestSecureRelayOverSASLSSL(t *testing.T) {
	t.Parallel()
	ke := testenv.SecureKafka(t)
	fences, store, _ := secureStores(t)
	ctx := testenv.Context(t, time.Minute)
	topic := ke.Topic(t, 1)
	src := fence.Key{Group: "g", Topic: "orders", Partition: 0}
	tok := fence.Token{Epoch: 1}
	if _, err := fences.Claim(ctx, src, tok, "test"); err != nil {
		t.Fatal(err)
	}
	const n = 50
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: topic, Key: []byte(fmt.Sprint(i % 5)), Value: []byte(fmt.Sprint(i))}
	}
	if err := fences.Apply(ctx, src, tok, 0, 0, func(ctx context.Context, tx pgx.Tx) error {
		return store.Append(ctx, tx, src, tok, msgs...)
	}); err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	cl, err := kgo.NewClient(append(ke.RuntimeOpts(t), kgo.WithLogger(kslog(&logs)))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	r, err := outbox.NewRelay(cl, store)
	if err != nil {
		t.Fatal(err)
	}
	if sent, err := r.Flush(ctx, src, tok); err != nil || sent != n {
		t.Fatalf("flush over SASL_SSL: %d sent, %v", sent, err)
	}
	rd, err := kgo.NewClient(append(ke.RuntimeOpts(t), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	var got []*kgo.Record
	for len(got) < n {
		fs := rd.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records: %v", len(got), n, ctx.Err())
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Fatalf("fetch: %v", err) })
		got = append(got, fs.Records()...)
	}
	for i, rec := range got {
		if string(rec.Value) != fmt.Sprint(i) || hdr(rec, "baton-seq") != fmt.Sprint(i+1) || hdr(rec, "baton-token") != tok.String() {
			t.Fatalf("record %d: value %q seq %q token %q", i, rec.Value, hdr(rec, "baton-seq"), hdr(rec, "baton-token"))
		}
	}
	if _, err := store.Cleanup(ctx, 0); err != nil {
		t.Fatalf("cleanup as the runtime role: %v", err)
	}
	testenv.NoSecrets(t, "the relay's logs", logs.String(), testenv.Secrets(t))
}

func kslog(w io.Writer) kgo.Logger {
	return kgo.BasicLogger(w, kgo.LogLevelInfo, nil)
}

// lockedBuffer is a log sink the client's goroutines write to concurrently.
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
