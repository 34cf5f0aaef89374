package shard

import (
	"context"
	"database/sql"
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/sqliteoutbox"
)

// TestOutboxPerShard shows the outbox over a router with no outbox router: each shard has its
// own outbox store and relay; the handler appends in its transaction (so in its partition's
// shard) and the after-commit hook flushes the relay of the partition's shard. Every message
// reaches the destination topic once, and each shard's outbox holds rows of its partitions only.
func TestOutboxPerShard(t *testing.T) {
	const partitions, per = 6, 20
	shards, stores, pl := liteShards(t, names3...)
	r := newRouter(t, shards, pl)
	brokers := testenv.FakeKafka(t, kfake.SeedTopics(partitions, "telemetry"), kfake.SeedTopics(1, "commands"))
	produce(t, brokers, partitions, per)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	must(t, err)
	defer cl.Close()
	boxes := map[string]*sqliteoutbox.Store{}
	relays := map[string]*outbox.Relay{}
	for _, n := range names3 {
		box, err := sqliteoutbox.New(stores[n])
		must(t, err)
		must(t, box.Migrate(t.Context()))
		boxes[n] = box
		relays[n], err = outbox.NewRelay(cl, box)
		must(t, err)
	}
	afterCommit := func(ctx context.Context, k fence.Key, tok fence.Token) error {
		_, err := relays[r.Placement().Shard(k)].Flush(ctx, k, tok)
		return err
	}
	group := testenv.UniqueName("shard")
	c, err := consumer.New(group, []string{"telemetry"}, r, func(ctx context.Context, tx *sql.Tx, b *consumer.Batch) error {
		msgs := make([]outbox.Message, len(b.Records))
		for i, rec := range b.Records {
			msgs[i] = outbox.Message{Topic: "commands", Key: rec.Key, Value: rec.Value}
		}
		return boxes[r.Placement().Shard(b.Key)].Append(ctx, tx, b.Key, b.Token, msgs...)
	}, consumer.Kafka(kgo.SeedBrokers(brokers...)), consumer.Logger(slog.New(slog.DiscardHandler)),
		consumer.AfterCommit(afterCommit, 50*time.Millisecond))
	must(t, err)
	stop := run(t, c)
	read, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("commands"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	must(t, err)
	defer read.Close()
	got := 0
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for got < partitions*per && ctx.Err() == nil {
		got += len(read.PollFetches(ctx).Records())
	}
	stop()
	if got != partitions*per {
		t.Fatalf("the destination topic holds %d messages, want %d", got, partitions*per)
	}
	for _, n := range names3 {
		var wrong, total int
		rows, err := stores[n].DB().Query(`SELECT partition FROM baton_outbox`)
		must(t, err)
		for rows.Next() {
			var p int32
			must(t, rows.Scan(&p))
			total++
			if r.Placement().Shard(fence.Key{Group: group, Topic: "telemetry", Partition: p}) != n {
				wrong++
			}
		}
		must(t, rows.Err())
		rows.Close()
		if wrong > 0 || total != 2*per {
			t.Errorf("shard %s's outbox holds %d rows, %d of partitions placed elsewhere; want %d, none", n, total, wrong, 2*per)
		}
	}
}
