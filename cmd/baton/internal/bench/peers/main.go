// Command peers serves the designs of 'baton bench' that use libraries Baton's library does
// not: watermill (github.com/ThreeDotsLabs/watermill) with its Kafka (watermill-kafka/v3, on
// Sarama) and SQL (watermill-sql/v4, on pgx) modules. It is a module of its own, so that
// those dependencies never enter the module graph of github.com/batonhq/baton: a replace
// directive points it at the repository's root, and 'baton bench' builds it with 'go build'
// and runs it as its worker for these designs, exactly as it runs itself for the others.
//
//	go build -o baton-bench-peers ./cmd/baton/internal/bench/peers   # from this directory's module
//	baton-bench-peers bench-worker -job '{...}'            # what 'baton bench' runs
package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/batonhq/baton/cmd/baton/internal/bench"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] != bench.WorkerCommand {
		fmt.Fprintf(os.Stderr, "usage: %s %s -job JSON (run by 'baton bench')\n", os.Args[0], bench.WorkerCommand)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := bench.Serve(ctx, os.Args[2:], map[string]bench.Design{"watermill": Watermill}, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "peers: %v\n", err)
		os.Exit(1)
	}
}

// Watermill is the job written the way watermill's documentation recommends for a consumer
// whose effect must land in PostgreSQL exactly once (the "exactly-once delivery counter"
// example of watermill's repository, and TxFromContext's doc): exactly-once needs a Pub/Sub
// whose offsets live in the same database as the writes, which watermill offers only with
// its SQL Pub/Sub. So a Router runs two handlers:
//
//  1. kafka-to-postgres: the Kafka subscriber (a consumer group, one partition's messages
//     handled one at a time) republishes every message to a PostgreSQL topic through the
//     SQL publisher (at-least-once: a crash between the insert and Kafka's offset commit
//     republishes);
//  2. apply: the SQL subscriber consumes that topic and applies each message's fold in the
//     transaction that consumes it (wsql.TxFromContext), committed with the message's ack.
//
// A record counts once the subscriber's transaction that applied it committed; the latency
// recorded is that transaction's, begin to commit.
func Watermill(ctx context.Context, job bench.Job, rec *bench.Recorder) error {
	pool, err := job.Pool(ctx, job.Partitions+2)
	if err != nil {
		return err
	}
	defer pool.Close()
	logger := watermill.NopLogger{}

	saramaCfg := kafka.DefaultSaramaSubscriberConfig()
	saramaCfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	kafkaSub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               job.Brokers,
		Unmarshaler:           kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: saramaCfg,
		ConsumerGroup:         job.Group,
	}, logger)
	if err != nil {
		return err
	}
	db := countingBeginner{Beginner: wsql.BeginnerFromPgx(pool), rec: rec}
	sqlPub, err := wsql.NewPublisher(db, wsql.PublisherConfig{
		SchemaAdapter:        wsql.DefaultPostgreSQLSchema{},
		AutoInitializeSchema: true,
	}, logger)
	if err != nil {
		return err
	}
	sqlSub, err := wsql.NewSubscriber(db, wsql.SubscriberConfig{
		ConsumerGroup:    job.Group,
		SchemaAdapter:    wsql.DefaultPostgreSQLSchema{},
		OffsetsAdapter:   wsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
		PollInterval:     10 * time.Millisecond,
	}, logger)
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, logger)
	if err != nil {
		return err
	}
	if err := pool.Ping(ctx); err != nil {
		return err
	}
	rec.Start()
	pgTopic := strings.NewReplacer("-", "_", ".", "_").Replace(job.Group)
	router.AddHandler("kafka-to-postgres", job.Topic, kafkaSub, pgTopic, sqlPub,
		func(msg *message.Message) ([]*message.Message, error) {
			return []*message.Message{msg}, nil
		})
	router.AddConsumerHandler("apply", pgTopic, sqlSub, func(msg *message.Message) error {
		tx, ok := wsql.TxFromContext(msg.Context())
		if !ok {
			return fmt.Errorf("message %s: no transaction in its context", msg.UUID)
		}
		ctr, ok := tx.(*countingTx)
		if !ok {
			return fmt.Errorf("message %s: transaction of type %T", msg.UUID, tx)
		}
		v, err := bench.Value(msg.Payload)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(msg.Context(), bench.FoldUpsert, msg.Metadata.Get("key"), v); err != nil {
			return err
		}
		ctr.applied++
		return nil
	})
	// Run returns once ctx ends and every handler stopped (the router closes gracefully).
	return router.Run(ctx)
}

// countingBeginner hands the subscriber transactions that count, on commit, the records
// applied in them.
type countingBeginner struct {
	wsql.Beginner
	rec *bench.Recorder
}

func (b countingBeginner) BeginTx(ctx context.Context, opts *sql.TxOptions) (wsql.Tx, error) {
	tx, err := b.Beginner.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &countingTx{Tx: tx, rec: b.rec, start: time.Now()}, nil
}

type countingTx struct {
	wsql.Tx
	rec     *bench.Recorder
	start   time.Time
	applied int64 // records the apply handler wrote in this transaction
}

func (t *countingTx) Commit() error {
	if err := t.Tx.Commit(); err != nil {
		return err
	}
	if t.applied > 0 {
		t.rec.Committed(t.applied, time.Since(t.start))
	}
	return nil
}
