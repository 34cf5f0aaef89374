package pgoutbox_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/pgoutbox"
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
// batch plus one outbox message per record (Append after Apply's fence round trip, and
// pipelined: ApplyBatch + QueueAppend in one round trip), and the raw ceiling: the same data
// and outbox-row inserts, into a table with the same keys and checks, in one transaction with
// no fence and no checks. Run them in one go to compare.
func BenchmarkApply(b *testing.B) {
	e := newEnv(b)
	tok := fence.Token{Epoch: 1}
	e.claim(tok)
	if _, err := e.pool.Exec(e.ctx, `CREATE TABLE raw_outbox (LIKE baton_outbox INCLUDING ALL)`); err != nil {
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
				err = e.fences.Apply(e.ctx, e.src, tok, pos, pos, fn)
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
	b.Run("data+outbox-pipelined", func(b *testing.B) {
		// pgfence.ApplyBatch + QueueAppend: fence, data and outbox rows in one round trip.
		b.ResetTimer()
		for done := 0; done < b.N; done += benchBatch {
			err := e.fences.ApplyBatch(e.ctx, e.src, tok, pos, pos, func(bt *pgx.Batch) error {
				bt.Queue(upsert, ids)
				return e.store.QueueAppend(e.ctx, bt, e.src, tok, msgs...)
			})
			pos++
			if err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
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

// Relay benchmarks on the real broker and PostgreSQL, shaped like Baton consumers relaying
// their own partitions: several source partitions, each with its own fence claim (as its owner
// would hold), an appender committing fenced transactions of K messages (one per poll batch),
// and a relay per source partition calling Flush after each commit and on an idle tick.
//
//	go test -run '^$' -bench 'RelayPaced' -benchtime 1x ./outbox/pgoutbox/ -outbox.paced 25s
//	go test -run '^$' -bench 'RelayMax' -benchtime 100000x ./outbox/pgoutbox/

var (
	pacedFor  = flag.Duration("outbox.paced", 20*time.Second, "BenchmarkRelayPaced: duration of the paced load")
	pacedRate = flag.Int("outbox.rate", 10000, "BenchmarkRelayPaced: total appended messages per second")
	pacedIdle = flag.Duration("outbox.idle", 100*time.Millisecond, "relay loops: idle tick between Flushes without a commit notification")
	linger    = flag.Duration("outbox.linger", -1, "relay client's kgo.ProducerLinger (negative: franz-go's default)")
)

// timedStore wraps the relay's store to split a Flush's time into the store's round trips
// and the rest (publishing: produce until every ack).
type timedStore struct {
	outbox.Store
	pendingCalls, pendingNanos, emptyPending atomic.Int64
	markCalls, markNanos                     atomic.Int64
}

func (s *timedStore) Pending(ctx context.Context, src fence.Key, tok fence.Token, limit int) ([]outbox.Row, error) {
	t := time.Now()
	rows, err := s.Store.Pending(ctx, src, tok, limit)
	s.pendingCalls.Add(1)
	s.pendingNanos.Add(int64(time.Since(t)))
	if len(rows) == 0 {
		s.emptyPending.Add(1)
	}
	return rows, err
}

func (s *timedStore) MarkDelivered(ctx context.Context, src fence.Key, tok fence.Token, through int64) (int64, error) {
	t := time.Now()
	n, err := s.Store.MarkDelivered(ctx, src, tok, through)
	s.markCalls.Add(1)
	s.markNanos.Add(int64(time.Since(t)))
	return n, err
}

func (s *timedStore) report(b *testing.B, flushNanos int64) {
	avg := func(n, c int64) float64 { return float64(n) / float64(max(c, 1)) / 1e6 }
	b.Logf("store: %d Pending calls (%d empty) avg %.1f ms; %d marks avg %.1f ms; publish avg %.1f ms per marked batch",
		s.pendingCalls.Load(), s.emptyPending.Load(), avg(s.pendingNanos.Load(), s.pendingCalls.Load()),
		s.markCalls.Load(), avg(s.markNanos.Load(), s.markCalls.Load()),
		avg(flushNanos-s.pendingNanos.Load()-s.markNanos.Load(), s.markCalls.Load()))
}

// ackHook records, for every record the relay's client acknowledged, the time of the
// acknowledgement by (source partition, seq): kgo calls it just before the produce promise,
// i.e. the moment the relay learns of the ack. Slots are preallocated and each is written by one
// callback only (a seq is acknowledged once unless a batch is re-published, which the
// benchmark reports as an error), and read after the relays have returned.
type ackHook struct {
	index map[string]int // source key string -> partition index
	acks  [][]int64      // [partition][seq] unix nanos of the first ack, 0 = none
	dups  atomic.Int64
	errs  atomic.Int64
}

func (h *ackHook) OnProduceRecordUnbuffered(rec *kgo.Record, err error) {
	now := time.Now().UnixNano()
	if err != nil {
		h.errs.Add(1)
		return
	}
	var src string
	var seq int64 = -1
	for _, hd := range rec.Headers {
		switch hd.Key {
		case "baton-source":
			src = string(hd.Value)
		case "baton-seq":
			seq, _ = strconv.ParseInt(string(hd.Value), 10, 64)
		}
	}
	p, ok := h.index[src]
	if !ok || seq < 0 || seq >= int64(len(h.acks[p])) {
		h.errs.Add(1)
		return
	}
	if !atomic.CompareAndSwapInt64(&h.acks[p][seq], 0, now) {
		h.dups.Add(1)
	}
}

// relayBench is the shared setup: parts source partitions claimed with tok, a pool large
// enough for one appender and one relay per partition (pgxpool's default of max(4, NumCPU)
// connections would make them queue for connections), a destination topic of 4 partitions
// and a relay whose client reports acks to hook.
type relayBench struct {
	ctx        context.Context
	pool       *pgxpool.Pool
	fences     *pgfence.Store
	store      *pgoutbox.Store
	srcs       []fence.Key
	tok        fence.Token
	topic      string
	relay      *outbox.Relay
	hook       *ackHook
	timed      *timedStore
	flushNanos atomic.Int64 // total time inside Flush, all partitions
}

func newRelayBench(b *testing.B, parts, maxSeq int, clientOpts ...kgo.Opt) *relayBench {
	b.Helper()
	ctx := testenv.Context(b, 10*time.Minute)
	_, schema := testenv.Postgres(b)
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = int32(2*parts + 2)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close) // registered after testenv's cleanup, so it runs before the schema drop
	fences, err := pgfence.New(pool)
	if err != nil {
		b.Fatal(err)
	}
	store, err := pgoutbox.New(pool, fences)
	if err != nil {
		b.Fatal(err)
	}
	if err := fences.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE accounts (id text PRIMARY KEY, balance bigint NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	rb := &relayBench{ctx: ctx, pool: pool, fences: fences, store: store, tok: fence.Token{Epoch: 1},
		hook: &ackHook{index: map[string]int{}}}
	for p := range parts {
		k := fence.Key{Group: "g", Topic: "orders", Partition: int32(p)}
		if _, err := fences.Claim(ctx, k, rb.tok, "test"); err != nil {
			b.Fatal(err)
		}
		rb.srcs = append(rb.srcs, k)
		rb.hook.index[k.String()] = p
		rb.hook.acks = append(rb.hook.acks, make([]int64, maxSeq+1))
	}
	bs := testenv.KafkaBrokers(b)
	rb.topic = testenv.NewTopic(b, bs, 4)
	opts := []kgo.Opt{kgo.WithHooks(rb.hook)}
	if *linger >= 0 {
		opts = append(opts, kgo.ProducerLinger(*linger))
	}
	cl := client(b, bs, append(opts, clientOpts...)...)
	rb.timed = &timedStore{Store: store}
	rb.relay = relay(b, cl, rb.timed)
	return rb
}

// apply commits one fenced transaction on source partition p at position pos: an upsert of k
// accounts and k outbox messages, like one consumer batch of k records.
func (rb *relayBench) apply(p int, pos int64, ids []string, msgs []outbox.Message) error {
	return rb.fences.Apply(rb.ctx, rb.srcs[p], rb.tok, pos, pos, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO accounts SELECT unnest($1::text[]), 1 ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + 1`, ids); err != nil {
			return err
		}
		return rb.store.Append(ctx, tx, rb.srcs[p], rb.tok, msgs...)
	})
}

// relayLoop is what the consumer's AfterCommit hook does for one partition: Flush after each
// commit (a notification from the appender) and on an idle tick, until stop is closed; then
// one last Flush. It returns the first error.
func (rb *relayBench) relayLoop(p int, notify <-chan struct{}, stop <-chan struct{}) error {
	tick := time.NewTicker(*pacedIdle)
	defer tick.Stop()
	for {
		if err := rb.flush(p); err != nil {
			return err
		}
		select {
		case <-notify:
		case <-tick.C:
		case <-stop:
			return rb.flush(p)
		}
	}
}

func (rb *relayBench) flush(p int) error {
	t := time.Now()
	_, err := rb.relay.Flush(rb.ctx, rb.srcs[p], rb.tok)
	rb.flushNanos.Add(int64(time.Since(t)))
	return err
}

func partMsgs(topic string, p, k int) ([]string, []outbox.Message) {
	ids := make([]string, k)
	msgs := make([]outbox.Message, k)
	for i := range k {
		ids[i] = "acct-" + strconv.Itoa(p) + "-" + strconv.Itoa(i)
		msgs[i] = outbox.Message{Topic: topic, Key: []byte(ids[i]), Value: make([]byte, 200)}
	}
	return ids, msgs
}

// BenchmarkRelayPaced measures commit->ack latency at a steady append rate (-outbox.rate,
// default 10k msg/s) for -outbox.paced (run it with -benchtime 1x). Each of parts appenders
// (one per source partition, as each partition's owner would) commits a fenced transaction of
// k messages every parts*k/rate seconds on a fixed schedule (open loop: a late commit does not
// push the later ones back; the achieved rate shows when the machine could not keep up). For
// every message the latency runs from its transaction's COMMIT returning to the broker's ack
// reaching the relay's client; p50/p99/max are over all messages.
//
// Modes: "loop" has a relay goroutine per partition woken by each commit or the idle tick;
// "inline" flushes in the appender's goroutine after each commit, which is what a Baton
// consumer's AfterCommit hook does (the next batch waits for the relay).
func BenchmarkRelayPaced(b *testing.B) {
	for _, c := range []struct {
		mode     string
		parts, k int
	}{
		{"loop", 4, 100}, {"inline", 4, 100}, {"loop", 4, 25},
	} {
		b.Run(fmt.Sprintf("mode=%s/parts=%d/k=%d", c.mode, c.parts, c.k), func(b *testing.B) {
			for range b.N {
				runPaced(b, c.mode == "inline", c.parts, c.k)
			}
		})
	}
}

func runPaced(b *testing.B, inline bool, parts, k int) {
	rate, dur := *pacedRate, *pacedFor
	interval := time.Duration(float64(time.Second) * float64(parts*k) / float64(rate))
	txs := int(dur / interval)
	rb := newRelayBench(b, parts, txs*k)
	commits := make([][]int64, parts) // [p][tx] unix nanos when COMMIT returned
	for p := range commits {
		commits[p] = make([]int64, txs)
	}
	var (
		wg       sync.WaitGroup
		errMu    sync.Mutex
		firstErr error
		late     atomic.Int64
	)
	fail := func(err error) {
		errMu.Lock()
		defer errMu.Unlock()
		if firstErr == nil {
			firstErr = err
		}
	}
	stop := make(chan struct{})
	var relays sync.WaitGroup
	start := time.Now().Add(50 * time.Millisecond)
	for p := range parts {
		notify := make(chan struct{}, 1)
		if !inline {
			relays.Go(func() {
				if err := rb.relayLoop(p, notify, stop); err != nil {
					fail(fmt.Errorf("relay %d: %w", p, err))
				}
			})
		}
		wg.Go(func() {
			ids, msgs := partMsgs(rb.topic, p, k)
			// Stagger the partitions across one interval, as independent owners would be.
			first := start.Add(interval * time.Duration(p) / time.Duration(parts))
			for i := range txs {
				due := first.Add(interval * time.Duration(i))
				if d := time.Until(due); d > 0 {
					time.Sleep(d)
				} else if d < -interval {
					late.Add(1)
				}
				if err := rb.apply(p, int64(i+1), ids, msgs); err != nil {
					fail(fmt.Errorf("append %d/%d: %w", p, i, err))
					return
				}
				commits[p][i] = time.Now().UnixNano()
				if inline {
					if err := rb.flush(p); err != nil {
						fail(fmt.Errorf("relay %d: %w", p, err))
						return
					}
					continue
				}
				select {
				case notify <- struct{}{}:
				default:
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	relays.Wait()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	var (
		lat      = make([]time.Duration, 0, parts*txs*k)
		missing  int
		lastAck  int64
		negative int
	)
	for p := range parts {
		for i := range txs {
			for j := 1; j <= k; j++ {
				ack := rb.hook.acks[p][i*k+j]
				if ack == 0 {
					missing++
					continue
				}
				lastAck = max(lastAck, ack)
				d := time.Duration(ack - commits[p][i])
				if d < 0 { // acked before Apply saw its COMMIT return: the relay was faster
					negative++
					d = 0
				}
				lat = append(lat, d)
			}
		}
	}
	if missing > 0 || rb.hook.errs.Load() > 0 {
		b.Fatalf("%d messages never acknowledged, %d produce errors", missing, rb.hook.errs.Load())
	}
	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	elapsed := time.Duration(lastAck - start.UnixNano())
	b.ReportMetric(ms(lat[len(lat)/2]), "p50-ms")
	b.ReportMetric(ms(lat[len(lat)*99/100]), "p99-ms")
	b.ReportMetric(ms(lat[len(lat)*999/1000]), "p99.9-ms")
	b.ReportMetric(ms(lat[len(lat)-1]), "max-ms")
	b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(late.Load()), "late-txs")
	b.ReportMetric(float64(rb.hook.dups.Load()), "dup-acks")
	b.Logf("%d msgs over %s (target %d msg/s: %d tx/s x %d msgs on %d partitions); %d acked before the commit returned; load %s",
		len(lat), elapsed.Round(time.Millisecond), rate, rate/k, k, parts, negative, loadavg())
	rb.timed.report(b, rb.flushNanos.Load())
}

// BenchmarkRelayMax measures the relays' maximum rate: b.N messages are appended first (split
// over the source partitions, timer stopped), then one relay per partition drains its backlog
// concurrently. Run with -benchtime Nx.
func BenchmarkRelayMax(b *testing.B) {
	for _, parts := range []int{1, 4} {
		b.Run("parts="+strconv.Itoa(parts), func(b *testing.B) {
			per := (b.N + parts - 1) / parts
			rb := newRelayBench(b, parts, per)
			const k = 1000
			var wg sync.WaitGroup
			errs := make([]error, parts)
			for p := range parts {
				wg.Go(func() {
					ids, msgs := partMsgs(rb.topic, p, k)
					for i, n := 0, 0; n < per; i++ {
						m := min(k, per-n)
						if err := rb.apply(p, int64(i+1), ids[:m], msgs[:m]); err != nil {
							errs[p] = err
							return
						}
						n += m
					}
				})
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for p := range parts {
				wg.Go(func() {
					n, err := rb.relay.Flush(rb.ctx, rb.srcs[p], rb.tok)
					if err == nil && n != per {
						err = fmt.Errorf("flushed %d of %d", n, per)
					}
					errs[p] = err
				})
			}
			wg.Wait()
			b.StopTimer()
			if err := errors.Join(errs...); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(per*parts)/b.Elapsed().Seconds(), "msgs/s")
			b.Logf("%d msgs, load %s", per*parts, loadavg())
		})
	}
}

// loadavg returns the 1-minute load average, for the record of each measurement.
func loadavg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
