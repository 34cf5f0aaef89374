package outboxconsumer_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/outboxconsumer"
	"github.com/batonhq/baton/outbox/sqliteoutbox"
)

// TestPipelineExactlyOnce wires the pieces the way an application does, on embedded defaults:
// a Baton consumer applies events and appends one command per event to the outbox in the same
// fenced transaction; the relay runs from each partition's goroutine through AfterCommit; a
// second Baton consumer receives the commands through the inbox. Copies of relayed records are
// then published again (as a zombie relay or a crash between produce and mark would): the
// receiver applies every command exactly once, in per-key order, and counts the copies as
// duplicates.
func TestPipelineExactlyOnce(t *testing.T) {
	ctx := testenv.Context(t, 2*time.Minute)
	brokers := testenv.FakeKafka(t, kfake.SeedTopics(4, "events", "commands"), kfake.GroupMinSessionTimeout(time.Second))
	dir := t.TempDir()
	kopts := []kgo.Opt{kgo.SeedBrokers(brokers...), kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}

	// Sender: state and outbox in one SQLite file.
	sendFence, err := sqlitefence.Open(filepath.Join(dir, "sender.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer sendFence.Close()
	box, err := sqliteoutbox.New(sendFence)
	if err == nil {
		err = box.Migrate(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	relayClient, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer relayClient.Close()
	relay, err := outbox.NewRelay(relayClient, box)
	if err != nil {
		t.Fatal(err)
	}
	sender, err := consumer.New("sender", []string{"events"}, fence.Sink[*sql.Tx](sendFence),
		nil, consumer.PerPartition(func(context.Context, fence.Key, fence.Token) (consumer.Handler[*sql.Tx], error) {
			return consumer.Handler[*sql.Tx](func(ctx context.Context, tx *sql.Tx, b *consumer.Batch) error {
				msgs := make([]outbox.Message, 0, len(b.Records))
				for _, r := range b.Records {
					msgs = append(msgs, outbox.Message{Topic: "commands", Key: r.Key, Value: r.Value})
				}
				return box.Append(ctx, tx, b.Key, b.Token, msgs...)
			}), nil
		}),
		consumer.Kafka(kopts...), consumer.Logger(quiet()),
		consumer.AfterCommit(relay.AfterCommit(), 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}

	// Receiver: its own SQLite file holding the inbox and the applied commands.
	recvFence, err := sqlitefence.Open(filepath.Join(dir, "receiver.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer recvFence.Close()
	if _, err := recvFence.DB().ExecContext(ctx, `CREATE TABLE applied (k TEXT NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (k, seq))`); err != nil {
		t.Fatal(err)
	}
	inbox, err := outbox.NewInbox[*sql.Tx]("receiver", recvFence)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var copies [][]*kgo.Record // relayed records seen by the receiver, to publish again
	receiver, err := consumer.New("receiver", []string{"commands"}, fence.Sink[*sql.Tx](recvFence),
		nil, consumer.PerPartition(func(context.Context, fence.Key, fence.Token) (consumer.Handler[*sql.Tx], error) {
			apply := consumer.Handler[*sql.Tx](func(ctx context.Context, tx *sql.Tx, b *consumer.Batch) error {
				for _, r := range b.Records {
					// The primary key makes a double apply fail loudly instead of passing silently.
					if _, err := tx.ExecContext(ctx, `INSERT INTO applied (k, seq) VALUES (?, ?)`, string(r.Key), string(r.Value)); err != nil {
						return consumer.Permanent(fmt.Errorf("applied twice: %s/%s: %w", r.Key, r.Value, err))
					}
				}
				mu.Lock()
				copies = append(copies, b.Records)
				mu.Unlock()
				return nil
			})
			return outboxconsumer.Handler(inbox, apply), nil
		}),
		consumer.Kafka(kopts...), consumer.Logger(quiet()))
	if err != nil {
		t.Fatal(err)
	}

	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, c := range []interface{ Run(context.Context) error }{sender, receiver} {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- c.Run(runCtx) }()
	}
	defer func() {
		cancel()
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	}()

	const keys, perKey = 8, 25
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	for seq := 0; seq < perKey; seq++ {
		for k := 0; k < keys; k++ {
			r := &kgo.Record{Topic: "events", Key: []byte(fmt.Sprintf("device-%d", k)), Value: []byte(strconv.Itoa(seq))}
			if err := prod.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	count := func() int {
		var n int
		_ = recvFence.DB().QueryRowContext(ctx, `SELECT count(*) FROM applied`).Scan(&n)
		return n
	}
	waitUntil(t, ctx, "every command applied", func() bool { return count() == keys*perKey })

	// Publish every relayed record again, headers and all.
	mu.Lock()
	var again []*kgo.Record
	for _, b := range copies {
		for _, r := range b {
			again = append(again, &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Headers: r.Headers})
		}
	}
	mu.Unlock()
	if err := prod.ProduceSync(ctx, again...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// The copies are consumed (the receiver's fence position passes them) and dropped.
	waitUntil(t, ctx, "the copies consumed", func() bool {
		var pos int64
		for p := int32(0); p < 4; p++ {
			st, err := recvFence.Load(ctx, fence.Key{Group: "receiver", Topic: "commands", Partition: p})
			if err != nil {
				return false
			}
			pos += st.Position + 1
		}
		return pos == int64(2*keys*perKey)
	})
	if n := count(); n != keys*perKey {
		t.Fatalf("applied %d commands, want %d (each exactly once)", n, keys*perKey)
	}
	// Per-key order: the receiver applied each key's sequence in order (checked via rowid order).
	rows, err := recvFence.DB().QueryContext(ctx, `SELECT k, seq FROM applied ORDER BY rowid`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	last := map[string]int{}
	for rows.Next() {
		var k string
		var seq int
		if err := rows.Scan(&k, &seq); err != nil {
			t.Fatal(err)
		}
		if prev, ok := last[k]; ok && seq != prev+1 {
			t.Fatalf("key %s: applied %d after %d", k, seq, prev)
		}
		last[k] = seq
	}
	if len(again) != keys*perKey {
		t.Fatalf("republished %d copies, want %d", len(again), keys*perKey)
	}
}

func waitUntil(t *testing.T, ctx context.Context, what string, ok func() bool) {
	t.Helper()
	for !ok() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
