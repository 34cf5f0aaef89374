// Package readme is the README's first program (README.md, "Using it"): a consumer folding
// each device's telemetry into its twin in SQLite, one statement per record in the fenced
// transaction. consumer's Example runs it, TestReadmeProgram keeps [Consume] and the README's
// block the same text, and 'baton bench' measures [ApplyTwinUpdates] as its baton design: the
// handler the README shows is the one the bench times. Like an example, it uses only Baton's
// public packages.
package readme

import (
	"context"
	"database/sql"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence/sqlitefence"
)

// Consume runs the README's program until ctx ends.
func Consume(ctx context.Context, path string, brokers []string) error {
	store, err := sqlitefence.Open(path) // the fence lives next to your data: pgfence.New(pool) for PostgreSQL
	if err != nil {
		return err
	}
	defer store.Close()
	c, err := consumer.New("devices", []string{"telemetry"}, store,
		func(ctx context.Context, tx *sql.Tx, b *consumer.Batch) error {
			// your writes, in the fenced transaction: a zombie's commit is refused
			return ApplyTwinUpdates(ctx, tx, b.Records)
		},
		consumer.Kafka(kgo.SeedBrokers(brokers...)), // any franz-go option: TLS, SASL, ...
	)
	if err != nil {
		return err // every misconfiguration at once, before anything starts
	}
	return c.Run(ctx) // blocks; nil after a clean shutdown (ctx cancelled)
}

// ApplyTwinUpdates folds each record (key: device, value: reading) into the device's twin:
// the table twins (device, reading, updates) holds each device's last reading and how many
// it received.
func ApplyTwinUpdates(ctx context.Context, tx *sql.Tx, recs []*kgo.Record) error {
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS twins (device TEXT PRIMARY KEY, reading TEXT, updates INTEGER)`); err != nil {
		return err
	}
	for _, r := range recs {
		if _, err := tx.ExecContext(ctx, `INSERT INTO twins VALUES (?, ?, 1)
			ON CONFLICT (device) DO UPDATE SET reading = excluded.reading, updates = updates + 1`, string(r.Key), string(r.Value)); err != nil {
			return err
		}
	}
	return nil
}
