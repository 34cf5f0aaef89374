package consumer_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

func realKafka(brokers []string) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(brokers...),
		kgo.FetchMaxWait(200 * time.Millisecond),
		kgo.SessionTimeout(6 * time.Second),
		kgo.HeartbeatInterval(500 * time.Millisecond),
		kgo.RebalanceTimeout(15 * time.Second),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	}
}

const pgSchema = `
CREATE TABLE kv (key text PRIMARY KEY, count bigint NOT NULL, last bigint NOT NULL);
CREATE TABLE writes (partition int NOT NULL, era bigint NOT NULL, epoch bigint NOT NULL, first bigint NOT NULL, last bigint NOT NULL);`

// pgFolder upserts each key's fold (count, last sequence) and records (partition, token,
// positions) of every batch in the same fenced transaction.
func pgFolder(ctx context.Context, k fence.Key, t fence.Token) (consumer.Handler[pgx.Tx], error) {
	return consumer.Handler[pgx.Tx](func(ctx context.Context, tx pgx.Tx, b *consumer.Batch) error {
		idx := map[string]int{}
		var keys []string
		var counts, lasts []int64
		for _, r := range b.Records {
			seq, err := strconv.ParseInt(string(r.Value), 10, 64)
			if err != nil {
				return consumer.Permanent(err)
			}
			k := string(r.Key)
			i, ok := idx[k]
			if !ok {
				i = len(keys)
				idx[k] = i
				keys, counts, lasts = append(keys, k), append(counts, 0), append(lasts, 0)
			}
			counts[i]++
			lasts[i] = seq
		}
		var batch pgx.Batch
		batch.Queue(`INSERT INTO kv SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[])
			ON CONFLICT (key) DO UPDATE SET count = kv.count + excluded.count, last = excluded.last`, keys, counts, lasts)
		batch.Queue(`INSERT INTO writes VALUES ($1, $2, $3, $4, $5)`, b.Key.Partition, b.Token.Era, b.Token.Epoch,
			b.Records[0].Offset, b.Records[len(b.Records)-1].Offset)
		return tx.SendBatch(ctx, &batch).Close()
	}), nil
}

func newPG(t *testing.T) (*pgxpool.Pool, *pgfence.Store) {
	t.Helper()
	pool, _ := testenv.Postgres(t)
	ctx := testenv.Context(t, time.Minute)
	if _, err := pool.Exec(ctx, pgSchema); err != nil {
		t.Fatal(err)
	}
	s, err := pgfence.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return pool, s
}

func pgApplied(t *testing.T, pool *pgxpool.Pool) int64 {
	var n int64
	if err := pool.QueryRow(context.Background(), `SELECT coalesce(sum(count), 0) FROM kv`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Three members joining and leaving over 12 partitions of the real broker, into the real
// PostgreSQL: every key's state is the fold of its records, and along every partition the
// tokens of the committed batches never go down.
func TestRealMembersChurnExactlyOnce(t *testing.T) { realChurn(t, 0) }

// The same in lane mode: 16 lanes per partition, each record's Prepare a simulated remote
// call; besides the fold and the tokens, one key's records are prepared one at a time and in
// order, and each record is applied with its own prepared result.
func TestRealMembersChurnExactlyOnceLanes(t *testing.T) { realChurn(t, 16) }

// realChurn runs the churn test with a plain handler (lanes 0) or a prepare stage in that many lanes.
func realChurn(t *testing.T, lanes int) {
	brokers := testenv.KafkaBrokers(t)
	pool, sink := newPG(t)
	topic := testenv.NewTopic(t, brokers, 12)
	group := testenv.UniqueName("g")
	keys, n := 1000, 100 // 100k records; BATON_CONSUMER_RECORDS_PER_KEY scales it
	if v := os.Getenv("BATON_CONSUMER_RECORDS_PER_KEY"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	if testing.Short() {
		n = 10
	}
	opts := []consumer.Option{consumer.Kafka(realKafka(brokers)...), consumer.Logger(quiet), consumer.GroupProtocol(testenv.GroupProtocol())}
	var checks laneChecks
	if lanes > 0 {
		remote := func(ctx context.Context, r *kgo.Record) error {
			select { // the remote call
			case <-time.After(time.Millisecond):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		st := newStages(func(ctx context.Context, k fence.Key, tk fence.Token) (*laneHandler[pgx.Tx], error) {
			h, err := pgFolder(ctx, k, tk)
			if err != nil {
				return nil, err
			}
			return withPrepare(h, &checks, remote), nil
		})
		opts = append(opts, st.perPartition(), st.lanes(lanes))
	} else {
		opts = append(opts, consumer.PerPartition(pgFolder))
	}
	newMember := func() *consumer.Consumer[pgx.Tx] {
		c, err := consumer.New(group, []string{topic}, sink, nil, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	produced := make(chan struct{})
	// Produce in paced chunks so that the membership changes below happen mid-stream.
	go func() {
		defer close(produced)
		const chunks = 10
		for i := 0; i < chunks; i++ {
			produceSeq(t, brokers, topic, keys, i*n/chunks+1, (i+1)*n/chunks)
			time.Sleep(700 * time.Millisecond)
		}
	}()
	a := start(t, newMember())
	time.Sleep(2 * time.Second)
	b := start(t, newMember())
	time.Sleep(2 * time.Second)
	c := start(t, newMember())
	time.Sleep(2 * time.Second)
	if err := a.stop(); err != nil {
		t.Fatalf("a: %v", err)
	}
	time.Sleep(time.Second)
	a2 := start(t, newMember())
	<-produced
	want := int64(keys * n)
	waitFor(t, "every record applied", 3*time.Minute, func() bool { return pgApplied(t, pool) >= want })
	for _, m := range []*member{b, c, a2} {
		if err := m.stop(); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	var bad int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM kv WHERE count <> $1 OR last <> $1`, n).Scan(&bad); err != nil {
		t.Fatal(err)
	}
	var nkeys int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM kv`).Scan(&nkeys); err != nil {
		t.Fatal(err)
	}
	if bad != 0 || nkeys != keys {
		t.Fatalf("%d of %d keys differ from the fold of their %d records", bad+keys-nkeys, keys, n)
	}
	var regress int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM (
		SELECT era, epoch, lag(era) OVER w AS pera, lag(epoch) OVER w AS pepoch FROM writes
		WINDOW w AS (PARTITION BY partition ORDER BY first)) x
		WHERE (era, epoch) < (pera, pepoch)`).Scan(&regress); err != nil {
		t.Fatal(err)
	}
	var owners int
	if err := pool.QueryRow(ctx, `SELECT count(DISTINCT (partition, era, epoch)) FROM writes`).Scan(&owners); err != nil {
		t.Fatal(err)
	}
	if regress != 0 {
		t.Fatalf("%d batches committed under a lower token than an earlier position's", regress)
	}
	if v := checks.Violations(); len(v) > 0 {
		t.Fatalf("%d lane violations, first %s", len(v), v[0])
	}
	if lanes > 0 {
		if p := checks.Peak(); p < 2 {
			t.Fatalf("at most %d Prepare call at once: the lanes never ran in parallel", p)
		}
		t.Logf("lanes %d: %d Prepare calls, at most %d at once", lanes, checks.Calls(), checks.Peak())
	}
	t.Logf("%d records, %d keys, %d (partition, token) ownerships", want, keys, owners)
}

// Deleting the group on the real broker while its members are stopped sends the generation
// back; on restart the regression is detected and processing resumes only through a recorded
// Recover; an old-era token is refused afterwards.
func TestRealGroupDeletedRegression(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	pool, sink := newPG(t)
	topic := testenv.NewTopic(t, brokers, 1)
	group := testenv.UniqueName("g")
	ctx := testenv.Context(t, 3*time.Minute)
	key := fence.Key{Group: group, Topic: topic, Partition: 0}
	run := func(from, to int, m *meter) {
		produceSeq(t, brokers, topic, 5, from, to)
		c, err := consumer.New(group, []string{topic}, sink, nil, consumer.PerPartition(pgFolder), consumer.Kafka(realKafka(brokers)...),
			consumer.Logger(quiet), consumer.MeterProvider(m), consumer.GroupProtocol(testenv.GroupProtocol()))
		if err != nil {
			t.Fatal(err)
		}
		mb := start(t, c)
		waitFor(t, "records applied", 2*time.Minute, func() bool { return pgApplied(t, pool) >= int64(5*to) })
		if err := mb.stop(); err != nil {
			t.Fatal(err)
		}
	}
	// Several generations first, so the sink stores an epoch the recreated group starts below.
	for i := 0; i < 3; i++ {
		run(i*2+1, i*2+2, newMeter())
	}
	before, err := sink.Load(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	resp, err := kadm.NewClient(cl).DeleteGroups(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	if r := resp[group]; r.Err != nil {
		t.Fatalf("delete group: %v", r.Err)
	}
	m := newMeter()
	run(7, 8, m)
	if got := m.sum(t, "baton.consumer.regressions"); got != 1 {
		t.Fatalf("regressions %d, want 1 (stored token before: %s)", got, before.Token)
	}
	recs, err := sink.Recoveries(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].From != before.Token || recs[0].To.Era != before.Token.Era+1 {
		t.Fatalf("recoveries %+v, want one from %s", recs, before.Token)
	}
	var bad int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM kv WHERE count <> 8 OR last <> 8`).Scan(&bad); err != nil || bad != 0 {
		t.Fatalf("%d keys differ from their fold (%v)", bad, err)
	}
	if _, err := sink.Claim(ctx, key, fence.Token{Era: before.Token.Era, Epoch: before.Token.Epoch + 100}, "test"); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("old-era claim: %v, want stale", err)
	}
}
