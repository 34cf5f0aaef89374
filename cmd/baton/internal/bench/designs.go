package bench

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync"
	"time"

	"github.com/batonhq/baton/internal/operator/redislock"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Designs returns the designs that need nothing of Baton: naive, redislock and ceiling.
func Designs() map[string]Design {
	return map[string]Design{"naive": Naive, "redislock": RedisLock, "ceiling": Ceiling, "kafka-read": KafkaRead}
}

// Kafka returns the client options every design's consumer starts from: the job's brokers
// and topic, a fresh group, from the start of the topic.
func (j Job) Kafka(extra ...kgo.Opt) []kgo.Opt {
	return append([]kgo.Opt{kgo.SeedBrokers(j.Brokers...), kgo.ConsumerGroup(j.Group), kgo.ConsumeTopics(j.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, extra...)
}

// Naive is what a consumer written without thought does: poll, and for each record one
// upsert in a transaction of its own (autocommit: one round trip), one record at a time;
// offsets committed by the client in the background. At-least-once: a crash replays records
// that were already applied.
func Naive(ctx context.Context, job Job, rec *Recorder) error {
	pool, err := job.Pool(ctx, 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return err
	}
	rec.Start()
	cl, err := kgo.NewClient(job.Kafka()...)
	if err != nil {
		return err
	}
	defer cl.Close()
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err := fetchErr(fs); err != nil {
			return err
		}
		for it := fs.RecordIter(); !it.Done(); {
			r := it.Next()
			v, err := Value(r.Value)
			if err != nil {
				return err
			}
			start := time.Now()
			if _, err := pool.Exec(ctx, FoldUpsert, string(r.Key), v); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			rec.Committed(1, time.Since(start))
		}
	}
}

// RedisLock is the common recipe: several workers, and around each write a Redis lock on
// the record's key (SET key token NX PX ttl; then compare-and-delete), the write in a
// transaction of its own. Records of one key go to one worker (hash of the key), so the
// order per key holds while nothing fails; the lock is what such a design relies on when
// something does (and why it loses updates then: see DESIGN.md).
func RedisLock(ctx context.Context, job Job, rec *Recorder) error {
	const workers = 8
	pool, err := job.Pool(ctx, workers)
	if err != nil {
		return err
	}
	defer pool.Close()
	locks := make([]*redislock.Client, workers)
	for i := range locks {
		if locks[i], err = redislock.Dial(ctx, job.Redis); err != nil {
			return err
		}
		defer locks[i].Close()
	}
	if err := pool.Ping(ctx); err != nil {
		return err
	}
	rec.Start()
	cl, err := kgo.NewClient(job.Kafka()...)
	if err != nil {
		return err
	}
	defer cl.Close()
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err := fetchErr(fs); err != nil {
			return err
		}
		queues := make([][]*kgo.Record, workers)
		fs.EachRecord(func(r *kgo.Record) {
			h := fnv.New32a()
			h.Write(r.Key)
			w := int(h.Sum32() % workers)
			queues[w] = append(queues[w], r)
		})
		var wg sync.WaitGroup
		errs := make([]error, workers)
		for w := range workers {
			wg.Go(func() {
				for _, r := range queues[w] {
					if err := lockedWrite(ctx, locks[w], pool, job.Group, r, rec); err != nil {
						errs[w] = err
						return
					}
				}
			})
		}
		wg.Wait()
		if ctx.Err() != nil {
			return nil
		}
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
	}
}

func lockedWrite(ctx context.Context, lock *redislock.Client, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, owner string, r *kgo.Record, rec *Recorder) error {
	v, err := Value(r.Value)
	if err != nil {
		return err
	}
	start := time.Now()
	key := "baton-bench:" + owner + ":" + string(r.Key)
	token := strconv.FormatInt(r.Offset, 10) + "@" + strconv.Itoa(int(r.Partition))
	for {
		ok, err := lock.TryAcquire(ctx, key, token, 10*time.Second)
		if err != nil {
			return err
		}
		if ok {
			break
		}
		select { // held by another worker: the recipe retries after a short sleep
		case <-ctx.Done():
			return nil
		case <-time.After(time.Millisecond):
		}
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, FoldUpsert, string(r.Key), v)
		return err
	})
	if rerr := lock.Release(ctx, key, token); err == nil {
		err = rerr
	}
	if err != nil {
		return err
	}
	rec.Committed(1, time.Since(start))
	return nil
}

// KafkaRead only reads the topic: a consumer group member polling every record and
// decoding nothing but the client's batches, no database. It is the ceiling of any design
// fed by this broker on this machine: Baton's rate is at most the lower of it and the
// database's ceiling. A "transaction" is one poll.
func KafkaRead(ctx context.Context, job Job, rec *Recorder) error {
	rec.Start()
	cl, err := kgo.NewClient(job.Kafka(append(job.FetchOpts(), kgo.WithHooks(phaseHook{rec}))...)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	for {
		start := time.Now()
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err := fetchErr(fs); err != nil {
			return err
		}
		switch n := fs.NumRecords(); {
		case n > 0 && job.Latency:
			rec.Seen(fs.Records(), time.Since(start))
		case n > 0:
			rec.Committed(int64(n), time.Since(start))
		}
	}
}

// Ceiling is the fastest way found for this PostgreSQL to absorb the same records: no Kafka,
// no fence, no runtime; the records, generated in memory exactly as produced, split by
// partition as the producer's partitioner split them, in chunks of 1000 in partition order,
// each chunk merged per key (as pgbulk.Merge does) and written by one unnest statement (one
// transaction), over job.Conns connections, each owning whole partitions.
func Ceiling(ctx context.Context, job Job, rec *Recorder) error {
	conns := max(job.Conns, 1)
	pool, err := job.Pool(ctx, conns)
	if err != nil {
		return err
	}
	defer pool.Close()
	parts := make([][][2]any, job.Partitions)
	part := kgo.StickyKeyPartitioner(nil).ForTopic(job.Topic)
	for _, r := range Records(job.Keys, job.PerKey()) {
		p := part.Partition(r, job.Partitions)
		parts[p] = append(parts[p], [2]any{string(r.Key), mustValue(r.Value)})
	}
	if err := Warm(ctx, pool); err != nil {
		return err
	}
	rec.Start()
	var wg sync.WaitGroup
	errs := make([]error, conns)
	for c := range conns {
		wg.Go(func() {
			for p := c; p < len(parts); p += conns {
				for recs := parts[p]; len(recs) > 0; {
					n := min(len(recs), Chunk)
					start := time.Now()
					if _, err := pool.Exec(ctx, FoldUnnest, mergedArrays(recs[:n])...); err != nil {
						if ctx.Err() == nil {
							errs[c] = err
						}
						return
					}
					rec.Committed(int64(n), time.Since(start))
					recs = recs[n:]
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	<-ctx.Done()
	return nil
}

// Chunk is how many records the ceilings write per statement (per transaction): the
// consumer's default bound of a batch (MaxInflightPerPartition).
const Chunk = 1000

// Partitioned returns the job's records as fold rows ([FoldRow]), split by partition as the
// producer's partitioner split them, in offset order.
func Partitioned(job Job) [][][]any {
	parts := make([][][]any, job.Partitions)
	part := kgo.StickyKeyPartitioner(nil).ForTopic(job.Topic)
	for _, r := range Records(job.Keys, job.PerKey()) {
		p := part.Partition(r, job.Partitions)
		parts[p] = append(parts[p], FoldRow(string(r.Key), mustValue(r.Value)))
	}
	return parts
}

func mustValue(v []byte) int64 {
	n, err := Value(v)
	if err != nil {
		panic(err)
	}
	return n
}

// mergedArrays folds recs (key, value) per key and returns the six column arrays.
func mergedArrays(recs [][2]any) []any {
	at := make(map[string]int, len(recs))
	var rows [][]any
	for _, r := range recs {
		row := FoldRow(r[0].(string), r[1].(int64))
		if i, ok := at[row[0].(string)]; ok {
			MergeFold(rows[i], row)
			continue
		}
		at[row[0].(string)] = len(rows)
		rows = append(rows, row)
	}
	keys := make([]string, len(rows))
	cols := [5][]int64{}
	for i, r := range rows {
		keys[i] = r[0].(string)
		for c := range 5 {
			cols[c] = append(cols[c], r[c+1].(int64))
		}
	}
	return []any{keys, cols[0], cols[1], cols[2], cols[3], cols[4]}
}

// Records returns the run's records in the order they are produced: for each value 1..perKey,
// every key in turn. Keys are "k00000", "k00001", ...; values are decimal. Every record also
// carries the headers a watermill subscriber reads as the message's UUID and metadata (its
// Kafka unmarshaler drops the record's key): the same bytes for every design.
func Records(keys int, perKey int64) []*kgo.Record {
	out := make([]*kgo.Record, 0, int64(keys)*perKey)
	for v := int64(1); v <= perKey; v++ {
		for k := range keys {
			out = append(out, record(k, v))
		}
	}
	return out
}

// record is the v-th record of the k-th key.
func record(k int, v int64) *kgo.Record {
	key := fmt.Sprintf("k%05d", k)
	return &kgo.Record{Key: []byte(key), Value: strconv.AppendInt(nil, v, 10),
		Headers: []kgo.RecordHeader{{Key: "_watermill_message_uuid", Value: fmt.Appendf(nil, "%s-%d", key, v)},
			{Key: "key", Value: []byte(key)}}}
}

// PadHeader is the header that pads a record to Config.Size; no design reads it.
const PadHeader = "pad"

// pad grows each record to size bytes (its key, value and headers' keys and values) with a
// [PadHeader] header of zeros, where it is smaller.
func pad(recs []*kgo.Record, size int) {
	zeros := make([]byte, size)
	for _, r := range recs {
		n := len(r.Key) + len(r.Value) + len(PadHeader)
		for _, h := range r.Headers {
			n += len(h.Key) + len(h.Value)
		}
		if fill := size - n; fill > 0 {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: PadHeader, Value: zeros[:fill]})
		}
	}
}

func fetchErr(fs kgo.Fetches) error {
	for _, fe := range fs.Errors() {
		return fmt.Errorf("fetch %s/%d: %w", fe.Topic, fe.Partition, fe.Err)
	}
	return nil
}
