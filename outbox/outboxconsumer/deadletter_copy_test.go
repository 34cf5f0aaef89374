package outboxconsumer_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
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

// A message the relay published twice (a crash between its produce and its mark, which is
// routine) reaches a receiver behind outboxconsumer.Handler as copy@0 and copy@1. Interleaving
// that broke the rule: the receiver admits copy@0 in the batch's transaction; the application
// refuses it for good (or its lanes preparation fails for good); the transaction rolls back
// with the admission; the poison path advances the fence over copy@0 and dead-letters it
// without recording the admission; copy@1 is then admitted: applied as well as dead-lettered
// when the refusal depended on state, dead-lettered a second time (at another baton.dlq.offset,
// which readers' deduplication does not catch) when it did not. And the reverse: copy@0
// applied, copy@1's preparation failing for good dead-letters a message already applied. With
// outboxconsumer.AdmitDeadLetters the admission commits with the dead letter, so a message is
// applied once or dead-lettered once, never both, never twice. (Mutant
// DeadLetterAdmissionNotRecorded: the dead-letter transaction without the admission.)
func TestCopyOfADeadLetteredMessageIsADuplicate(t *testing.T) {
	for _, c := range []struct {
		name    string
		refuse  func(seen int) bool // the handler refuses M's seen'th copy (1-based) for good
		prepare func(seen int) bool // with Lanes, M's seen'th preparation fails for good
		outbox  bool                // dead letters through outboxconsumer.DeadLetters
		applied int                 // M applied, want
		dead    int                 // M dead-lettered, want
	}{
		{name: "refused once, produced directly", refuse: func(n int) bool { return n == 1 }, dead: 1},
		{name: "refused always, produced directly", refuse: func(int) bool { return true }, dead: 1},
		{name: "refused always, through the outbox", refuse: func(int) bool { return true }, outbox: true, dead: 1},
		{name: "refused once, through the outbox", refuse: func(n int) bool { return n == 1 }, outbox: true, dead: 1},
		{name: "prepare failed once", prepare: func(n int) bool { return n == 1 }, dead: 1},
		{name: "prepare failed always", prepare: func(int) bool { return true }, dead: 1},
		{name: "prepare failed on the copy", prepare: func(n int) bool { return n == 2 }, applied: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			applied, dead := deadLetteredCopies(t, c.refuse, c.prepare, c.outbox)
			if applied != c.applied || dead != c.dead {
				t.Fatalf("message applied %d times and dead-lettered %d times, want %d and %d: a copy of a dead-lettered message was admitted",
					applied, dead, c.applied, c.dead)
			}
		})
	}
}

// deadLetteredCopies runs a receiver over copy@0 and copy@1 of message M (key "m") and then
// message N (key "n"), until N is applied, and returns how many times M was applied and
// dead-lettered (counted in the dead-letter topic, or in the outbox's rows for it).
func deadLetteredCopies(t *testing.T, refuse, prepare func(int) bool, viaOutbox bool) (applied, dead int) {
	ctx := testenv.Context(t, time.Minute)
	brokers := testenv.FakeKafka(t, kfake.SeedTopics(1, "commands", "commands.dlq"), kfake.GroupMinSessionTimeout(time.Second))
	kopts := []kgo.Opt{kgo.SeedBrokers(brokers...), kgo.FetchMaxWait(100 * time.Millisecond)}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("commands"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	relayed := func(key string, seq int) *kgo.Record {
		return &kgo.Record{Key: []byte(key), Value: []byte(key), Headers: []kgo.RecordHeader{
			{Key: "baton-token", Value: []byte("0.1")},
			{Key: "baton-seq", Value: []byte(fmt.Sprint(seq))},
			{Key: "baton-source", Value: []byte("sender/events/0")},
		}}
	}
	for _, r := range []*kgo.Record{relayed("m", 1), relayed("m", 1), relayed("n", 2)} { // offsets 0, 1, 2
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}

	store, err := sqlitefence.Open(filepath.Join(t.TempDir(), "receiver.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if _, err := store.DB().ExecContext(ctx, `CREATE TABLE applied (k TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	inbox, err := outbox.NewInbox[*sql.Tx]("receiver", store)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen, prepared := 0, 0 // M's copies the handler, and the preparation, saw
	apply := consumer.Handler[*sql.Tx](func(ctx context.Context, tx *sql.Tx, b *consumer.Batch) error {
		for _, r := range b.Records {
			if string(r.Key) == "m" && refuse != nil {
				mu.Lock()
				seen++
				no := refuse(seen)
				mu.Unlock()
				if no {
					return b.Fail(r, fmt.Errorf("refused"))
				}
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO applied (k) VALUES (?)`, string(r.Key)); err != nil {
				return err
			}
		}
		return nil
	})
	opts := []consumer.Option{consumer.Kafka(kopts...), consumer.Logger(quiet()), outboxconsumer.AdmitDeadLetters(inbox)}
	if prepare != nil {
		opts = append(opts, consumer.Lanes(2, func(_ context.Context, _ fence.Key, _ fence.Token, r *kgo.Record) (any, error) {
			if string(r.Key) != "m" {
				return nil, nil
			}
			mu.Lock()
			defer mu.Unlock()
			prepared++
			if prepare(prepared) {
				return nil, consumer.Permanent(fmt.Errorf("cannot prepare"))
			}
			return nil, nil
		}))
	}
	var box *sqliteoutbox.Store
	if viaOutbox {
		if box, err = sqliteoutbox.New(store); err == nil {
			err = box.Migrate(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, outboxconsumer.DeadLetters[*sql.Tx](box))
	}
	c, err := consumer.New("receiver", []string{"commands"}, fence.Sink[*sql.Tx](store), outboxconsumer.Handler(inbox, apply), opts...)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	k := fence.Key{Group: "receiver", Topic: "commands", Partition: 0}
	for {
		st, err := store.Load(ctx, k)
		if err == nil && st.Position >= 2 {
			break
		}
		if ctx.Err() != nil {
			cancel()
			t.Fatalf("timed out waiting for the three records applied or dead-lettered: %v %+v", err, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	if err := store.DB().QueryRowContext(ctx, `SELECT count(*) FROM applied WHERE k = 'm'`).Scan(&applied); err != nil {
		t.Fatal(err)
	}
	if viaOutbox {
		if err := store.DB().QueryRowContext(ctx, `SELECT count(*) FROM baton_outbox WHERE dest_topic = 'commands.dlq'`).Scan(&dead); err != nil {
			t.Fatal(err)
		}
		return applied, dead
	}
	// The dead-letter topic, read to its end.
	rd, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("commands.dlq"), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		pctx, pcancel := context.WithTimeout(ctx, 200*time.Millisecond)
		fs := rd.PollFetches(pctx)
		pcancel()
		fs.EachRecord(func(r *kgo.Record) {
			if string(r.Key) == "m" {
				dead++
			}
		})
	}
	return applied, dead
}
