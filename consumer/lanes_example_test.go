package consumer_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
)

// calibrate asks a (simulated) device gateway for a reading's calibrated value: the slow
// first stage, run in the partition's lanes and outside any transaction. It is a read (safe to
// repeat, and harmless from a member that lost the partition): effects that must happen once
// would be appended to the outbox by the handler.
func calibrate(ctx context.Context, _ fence.Key, _ fence.Token, r *kgo.Record) (any, error) {
	select {
	case <-time.After(5 * time.Millisecond): // the remote call
		return strings.ToUpper(string(r.Value)), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// With consumer.Lanes, the slow part of handling a record (prepare) runs for
// up to 8 records of a partition at once (one key's records one after another, in order),
// while the partition's goroutine stays its only writer.
func ExampleLanes() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "readings"))
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
	for _, rd := range [][2]string{{"d1", "low"}, {"d2", "ok"}, {"d1", "ok"}, {"d3", "high"}} {
		prod.ProduceSync(context.Background(), &kgo.Record{Topic: "readings", Key: []byte(rd[0]), Value: []byte(rd[1])})
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
	c, err := consumer.New("twins", []string{"readings"}, store,
		func(ctx context.Context, tx *sql.Tx, b *consumer.Batch) error {
			for i, r := range b.Records { // the handler writes the results in the fenced transaction, in offset order
				if _, err := tx.ExecContext(ctx, `INSERT INTO twins VALUES (?, ?)
					ON CONFLICT (device) DO UPDATE SET reading = excluded.reading`, string(r.Key), b.Prepared[i].(string)); err != nil {
					return err
				}
			}
			return nil
		},
		consumer.Lanes(8, calibrate),
		consumer.Kafka(kgo.SeedBrokers(brokers...), kgo.FetchMaxWait(100*time.Millisecond),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())),
		consumer.Logger(quiet))
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	for { // until the last record (offset 3) is committed: the position its fence row keeps
		if st, err := store.Load(ctx, fence.Key{Group: "twins", Topic: "readings", Partition: 0}); err == nil && st.Position >= 3 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	fmt.Println("Run:", <-done)
	for _, dev := range []string{"d1", "d2", "d3"} {
		var v string
		_ = store.DB().QueryRow(`SELECT reading FROM twins WHERE device = ?`, dev).Scan(&v)
		fmt.Println(dev, v)
	}
	// Output:
	// Run: <nil>
	// d1 OK
	// d2 OK
	// d3 HIGH
}
