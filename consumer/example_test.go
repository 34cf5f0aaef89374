package consumer_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
)

// A handler that keeps state per partition is built by a factory when this member is assigned
// the partition (PerPartition); New's handler is nil. Kafka is in-process here (kfake) and the
// store an SQLite file.
func ExamplePerPartition() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "readings"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		panic(err)
	}
	defer prod.Close()
	for _, dev := range []string{"d1", "d2", "d1", "d3", "d1"} {
		prod.ProduceSync(context.Background(), &kgo.Record{Topic: "readings", Key: []byte(dev), Value: []byte("21.5")})
	}

	dir, err := os.MkdirTemp("", "baton-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	store, err := sqlitefence.Open(filepath.Join(dir, "twins.db"))
	if err != nil {
		panic(err)
	}
	defer store.Close()
	if _, err := store.DB().Exec(`CREATE TABLE twins (device TEXT PRIMARY KEY, reading TEXT)`); err != nil {
		panic(err)
	}
	c, err := consumer.New("twins", []string{"readings"}, store, nil,
		consumer.PerPartition(func(_ context.Context, _ fence.Key, _ fence.Token) (consumer.Handler[*sql.Tx], error) {
			// State here belongs to this partition's goroutine alone: no locks.
			return func(ctx context.Context, tx *sql.Tx, b *consumer.Batch) error {
				for _, r := range b.Records {
					if _, err := tx.ExecContext(ctx, `INSERT INTO twins VALUES (?, ?)
						ON CONFLICT (device) DO UPDATE SET reading = excluded.reading`, string(r.Key), string(r.Value)); err != nil {
						return err
					}
				}
				return nil
			}, nil
		}),
		consumer.Kafka(kgo.SeedBrokers(brokers...), kgo.FetchMaxWait(100*time.Millisecond),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())),
		consumer.Logger(quiet))
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	for committed := int64(0); committed < 5; { // until the five records are committed: the positions the fence rows keep
		time.Sleep(10 * time.Millisecond)
		committed = 0
		for p := int32(0); p < 2; p++ {
			if st, err := store.Load(ctx, fence.Key{Group: "twins", Topic: "readings", Partition: p}); err == nil {
				committed += st.Position + 1 // the next offset; NoPosition (-1) before the first
			}
		}
	}
	cancel()
	fmt.Println("Run:", <-done)
	for _, dev := range []string{"d1", "d2", "d3"} {
		var v string
		err := store.DB().QueryRow(`SELECT reading FROM twins WHERE device = ?`, dev).Scan(&v)
		fmt.Println(dev, v, err == nil)
	}
	// Output:
	// Run: <nil>
	// d1 21.5 true
	// d2 21.5 true
	// d3 21.5 true
}
