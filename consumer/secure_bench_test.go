package consumer_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// BenchmarkSecureVsPlain measures what the secure setup costs, paired: in every iteration the
// same pre-produced records are consumed (a fresh group each time) over the broker's plaintext
// listener and over its SASL_SSL listener (SCRAM-SHA-512, mutual TLS, ACL authorizer), back to
// back in alternating order, and the median ratio of neighbouring runs is reported:
//
//	consume   raw franz-go group member polling the topic to the end: the Kafka side alone
//	baton     consumer.Consumer over pgfence with the fold handler: plaintext Kafka and
//	          PostgreSQL (sslmode=disable, the owner role) vs SASL_SSL and verify-full as the
//	          least-privilege runtime role
//
//	go test -run '^$' -bench SecureVsPlain -benchtime 5x ./consumer/
//
// BATON_BENCH_RECORDS sets the record count (default 50000, over 1000 keys). Needs both the
// plaintext and the secure services (BATON_SECURE=1 make up).
func BenchmarkSecureVsPlain(b *testing.B) {
	ke := testenv.SecureKafka(b)
	plainBrokers := testenv.KafkaBrokers(b)
	ctx := context.Background()
	const keys = 1000
	n := 50_000
	if v := os.Getenv("BATON_BENCH_RECORDS"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	perKey := n / keys
	n = perKey * keys
	// One topic, readable on both listeners; the runtime principal has its ACLs.
	topic := ke.Topic(b, 12)
	produceOpts(b, ke.AdminOpts(b), topic, keys, perKey)

	plainPool, _ := testenv.Postgres(b)
	plainSink := benchSink(b, plainPool, plainPool, "")
	sp := testenv.SecurePostgres(b)
	secureSink := benchSink(b, sp.Admin, sp.Runtime, sp.RuntimeRole)

	type side struct {
		kafka []kgo.Opt
		group func() string
		pool  *pgxpool.Pool
		sink  *pgfence.Store
	}
	plain := side{kafka: []kgo.Opt{kgo.SeedBrokers(plainBrokers...)}, group: func() string { return testenv.UniqueName("g") },
		pool: plainPool, sink: plainSink}
	sec := side{kafka: ke.RuntimeOpts(b), group: func() string { return ke.Group(b) }, pool: sp.Runtime, sink: secureSink}

	consume := func(s side) time.Duration {
		cl, err := kgo.NewClient(append(s.kafka, kgo.ConsumerGroup(s.group()), kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))...)
		if err != nil {
			b.Fatal(err)
		}
		defer cl.Close()
		start, got := time.Now(), 0
		cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		for got < n {
			fs := cl.PollFetches(cctx)
			if cctx.Err() != nil {
				b.Fatalf("consumed %d of %d", got, n)
			}
			got += fs.NumRecords()
		}
		return time.Since(start)
	}
	baton := func(s side) time.Duration {
		if _, err := s.pool.Exec(ctx, `DELETE FROM kv; DELETE FROM writes`); err != nil {
			b.Fatal(err)
		}
		c, err := consumer.New(s.group(), []string{topic}, s.sink, nil, consumer.PerPartition(pgFolder),
			consumer.Kafka(append(s.kafka, kgo.FetchMaxWait(100*time.Millisecond), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...),
			consumer.Logger(quiet))
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.Run(rctx) }()
		applied := func() int64 {
			var m int64
			if err := s.pool.QueryRow(ctx, `SELECT coalesce(sum(count), 0) FROM kv`).Scan(&m); err != nil {
				b.Fatal(err)
			}
			return m
		}
		for applied() < int64(n) {
			if time.Since(start) > 5*time.Minute {
				b.Fatal("not applied in 5 minutes")
			}
			time.Sleep(20 * time.Millisecond)
		}
		took := time.Since(start)
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		return took
	}
	for _, v := range []struct {
		name string
		run  func(side) time.Duration
	}{{"consume", consume}, {"baton", baton}} {
		b.Run(v.name, func(b *testing.B) {
			b.StopTimer()
			var tp, ts time.Duration
			var ratios []float64
			for i := range b.N {
				var p, s time.Duration
				if i%2 == 0 {
					p, s = v.run(plain), v.run(sec)
				} else {
					s, p = v.run(sec), v.run(plain)
				}
				tp, ts = tp+p, ts+s
				ratios = append(ratios, p.Seconds()/s.Seconds()) // secure rate / plain rate
			}
			recs := float64(n) * float64(b.N)
			b.ReportMetric(recs/tp.Seconds(), "plain-records/s")
			b.ReportMetric(recs/ts.Seconds(), "secure-records/s")
			b.ReportMetric(median(ratios), "secure/plain")
		})
	}
}

// benchSink migrates pgfence and the fold tables as admin and returns the store on pool (the
// runtime role's, granted RuntimeGrants, when role is set).
func benchSink(b *testing.B, admin, pool *pgxpool.Pool, role string) *pgfence.Store {
	ctx := context.Background()
	a, err := pgfence.New(admin)
	if err != nil {
		b.Fatal(err)
	}
	if err := a.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	if _, err := admin.Exec(ctx, pgSchema); err != nil {
		b.Fatal(err)
	}
	if role != "" {
		grants, err := a.RuntimeGrants(role)
		if err != nil {
			b.Fatal(err)
		}
		for _, g := range append(grants, "GRANT SELECT, INSERT, UPDATE, DELETE ON kv, writes TO "+role) {
			if _, err := admin.Exec(ctx, g); err != nil {
				b.Fatal(err)
			}
		}
	}
	s, err := pgfence.New(pool)
	if err != nil {
		b.Fatal(err)
	}
	return s
}
