package pgoutbox_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/testenv"
	"github.com/batonhq/baton/outbox"
)

const benchBatch = 100 // records per fenced transaction, like one consumer batch

func benchMsgs(topic string, n int) []outbox.Message {
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: topic, Key: []byte("acct-" + strconv.Itoa(i)), Value: make([]byte, 200)}
	}
	return msgs
}

// BenchmarkApply compares, per record (b.N), a fenced batch of state changes alone, the same
// batch plus one outbox message per record, and the raw ceiling: the same data and outbox-row
// inserts in one transaction with no fence and no checks. Run them in one go to compare.
func BenchmarkApply(b *testing.B) {
	e := newEnv(b)
	tok := fence.Token{Epoch: 1}
	e.claim(tok)
	if _, err := e.pool.Exec(e.ctx, `CREATE TABLE raw_outbox (LIKE baton_outbox INCLUDING DEFAULTS)`); err != nil {
		b.Fatal(err)
	}
	msgs := benchMsgs("dest", benchBatch)
	ids := make([]string, benchBatch)
	for i := range ids {
		ids[i] = "acct-" + strconv.Itoa(i)
	}
	const upsert = `INSERT INTO accounts SELECT unnest($1::text[]), 1 ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + 1`
	pos := int64(0)
	run := func(b *testing.B, fn func(ctx context.Context, tx pgx.Tx) error, fenced bool) {
		b.ResetTimer()
		for done := 0; done < b.N; done += benchBatch {
			var err error
			if fenced {
				err = e.fences.Apply(e.ctx, e.src, tok, pos, fn)
				pos++
			} else {
				err = pgx.BeginFunc(e.ctx, e.pool, func(tx pgx.Tx) error { return fn(e.ctx, tx) })
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
	}
	b.Run("data", func(b *testing.B) {
		run(b, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, upsert, ids)
			return err
		}, true)
	})
	b.Run("data+outbox", func(b *testing.B) {
		run(b, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, upsert, ids); err != nil {
				return err
			}
			return e.store.Append(ctx, tx, e.src, tok, msgs...)
		}, true)
	})
	seq := int64(0)
	b.Run("raw-data+outbox-insert", func(b *testing.B) {
		vals := make([][]byte, benchBatch)
		keys := make([][]byte, benchBatch)
		for i := range vals {
			vals[i], keys[i] = msgs[i].Value, msgs[i].Key
		}
		run(b, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, upsert, ids); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO raw_outbox (group_id, topic, partition, seq, era, epoch, dest_topic, msg_key, msg_value, idempotency_key)
SELECT 'g', 'orders', 3, $1::bigint + u.ord, 0, 1, 'dest', u.k, u.v, 'x' FROM unnest($2::bytea[], $3::bytea[]) WITH ORDINALITY AS u(k, v, ord)`, seq, keys, vals)
			seq += benchBatch
			return err
		}, false)
	})
}

// BenchmarkRelay measures the relay on the real broker at its maximum rate: b.N rows are
// appended first, then one Flush publishes them; it reports messages/s, and the commit->ack
// latency of a paced run: batches of 100 appended and flushed one after another, latency
// measured from just before the commit to Flush's return (every row of the batch acknowledged
// and marked).
func BenchmarkRelay(b *testing.B) {
	bs := testenv.KafkaBrokers(b)
	topic := testenv.NewTopic(b, bs, 1)
	e := newEnv(b)
	tok := fence.Token{Epoch: 1}
	e.claim(tok)
	r := relay(b, client(b, bs), e.store)
	pos := int64(0)
	appendN := func(n int) {
		for n > 0 {
			k := min(n, 1000)
			if err := e.apply(e.ctx, tok, pos, benchMsgs(topic, k)...); err != nil {
				b.Fatal(err)
			}
			pos++
			n -= k
		}
	}
	b.Run("max-rate", func(b *testing.B) {
		appendN(b.N)
		b.ResetTimer()
		n, err := r.Flush(e.ctx, e.src, tok)
		if err != nil || n != b.N {
			b.Fatalf("Flush = %d, %v", n, err)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
	b.Run("batch-commit-to-ack", func(b *testing.B) {
		var lat []time.Duration
		for done := 0; done < b.N; done += benchBatch {
			start := time.Now()
			appendN(benchBatch)
			if n, err := r.Flush(e.ctx, e.src, tok); err != nil || n != benchBatch {
				b.Fatalf("Flush = %d, %v", n, err)
			}
			lat = append(lat, time.Since(start))
		}
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
}
