package shard

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

const appliedSchema = `CREATE TABLE IF NOT EXISTS applied (p INTEGER NOT NULL, off INTEGER NOT NULL, PRIMARY KEY (p, off))`

// shardedRun produces perPartition records to each of partitions partitions of a kfake topic
// and returns a consumer over a router of three SQLite shards whose handler inserts one
// applied row per record in its shard's transaction.
func shardedRun(t *testing.T, partitions int32, perPartition int, opts ...consumer.Option) (*consumer.Consumer[*sql.Tx], Router[*sql.Tx], map[string]*sqlitefence.Store, string, []string) {
	t.Helper()
	shards, stores, pl := liteShards(t, names3...)
	for _, s := range stores {
		if _, err := s.DB().Exec(appliedSchema); err != nil {
			t.Fatal(err)
		}
	}
	r := newRouter(t, shards, pl)
	brokers := testenv.FakeKafka(t, kfake.SeedTopics(partitions, "telemetry"))
	produce(t, brokers, partitions, perPartition)
	group := testenv.UniqueName("shard")
	c, err := consumer.New(group, []string{"telemetry"}, r, func(ctx context.Context, tx *sql.Tx, b *consumer.Batch) error {
		for _, rec := range b.Records {
			if _, err := tx.ExecContext(ctx, `INSERT INTO applied (p, off) VALUES (?, ?)`, rec.Partition, rec.Offset); err != nil {
				return err
			}
		}
		return nil
	}, append([]consumer.Option{consumer.Kafka(kgo.SeedBrokers(brokers...)), consumer.Logger(slog.New(slog.DiscardHandler)),
		consumer.RetryBackoff(20*time.Millisecond, 200*time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c, r, stores, group, brokers
}

// produce writes perPartition records to each partition of the topic telemetry.
func produce(t *testing.T, brokers []string, partitions int32, perPartition int) {
	t.Helper()
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("telemetry"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	var recs []*kgo.Record
	for p := range partitions {
		for i := range perPartition {
			recs = append(recs, &kgo.Record{Partition: p, Key: fmt.Appendf(nil, "d%d", i%7), Value: []byte("x")})
		}
	}
	if err := prod.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// appliedOn returns the applied rows shard s holds, per partition.
func appliedOn(t *testing.T, s *sqlitefence.Store) map[int32]int {
	t.Helper()
	rows, err := s.DB().Query(`SELECT p, count(*) FROM applied GROUP BY p`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[int32]int{}
	for rows.Next() {
		var p int32
		var n int
		if err := rows.Scan(&p, &n); err != nil {
			t.Fatal(err)
		}
		got[p] = n
	}
	return got
}

func run(t *testing.T, c *consumer.Consumer[*sql.Tx]) (stop func()) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}

// waitApplied waits until want(total per shard) holds, or fails after 30s.
func waitApplied(t *testing.T, stores map[string]*sqlitefence.Store, what string, want func(map[string]int) bool) map[string]int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		per := map[string]int{}
		for n, s := range stores {
			for _, c := range appliedOn(t, s) {
				per[n] += c
			}
		}
		if want(per) {
			return per
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: applied per shard %v", what, per)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestConsumerAppliesEachPartitionInItsShard runs consumer.New unchanged over a three-shard
// router: every record is applied once, in the database of its partition's shard, and no
// shard holds a row or a fence of a partition placed elsewhere.
func TestConsumerAppliesEachPartitionInItsShard(t *testing.T) {
	const partitions, per = 6, 50
	c, r, stores, group, _ := shardedRun(t, partitions, per)
	stop := run(t, c)
	waitApplied(t, stores, "every record", func(m map[string]int) bool { return m["a"]+m["b"]+m["c"] == partitions*per })
	stop()
	p := r.Placement()
	for _, n := range names3 {
		for part, cnt := range appliedOn(t, stores[n]) {
			k := fence.Key{Group: group, Topic: "telemetry", Partition: part}
			if p.Shard(k) != n || cnt != per {
				t.Errorf("shard %s holds %d rows of partition %d, placed on %s: want %d there and none elsewhere", n, cnt, part, p.Shard(k), per)
			}
		}
		for part := range int32(partitions) {
			k := fence.Key{Group: group, Topic: "telemetry", Partition: part}
			st, err := stores[n].Load(t.Context(), k)
			must(t, err)
			if placed := p.Shard(k) == n; placed != (st.Position == per-1) || (!placed && st.Claimant != "") {
				t.Errorf("shard %s stores fence %s = %+v; the partition is placed on %s", n, k, st, p.Shard(k))
			}
		}
	}
}

// TestShardOutageStallsOnlyItsPartitions makes shard c refuse every write (another connection
// holds its write lock) while a running consumer has records to apply on every shard: the
// partitions placed on a and b apply theirs in full during the outage, c's none; once c is
// back its partitions catch up, every record applied exactly once.
func TestShardOutageStallsOnlyItsPartitions(t *testing.T) {
	const partitions, before, during = 6, 50, 300
	c, r, stores, group, brokers := shardedRun(t, partitions, before)
	onC := 0
	for part := range int32(partitions) {
		if r.Placement().Shard(fence.Key{Group: group, Topic: "telemetry", Partition: part}) == "c" {
			onC++
		}
	}
	stop := run(t, c)
	waitApplied(t, stores, "the records before the outage", func(m map[string]int) bool { return m["a"]+m["b"]+m["c"] == partitions*before })
	lock, err := stores["c"].DB().Conn(t.Context())
	must(t, err)
	defer lock.Close()
	_, err = lock.ExecContext(t.Context(), `BEGIN EXCLUSIVE`)
	must(t, err)
	outage := time.Now()
	produce(t, brokers, partitions, during)
	others := waitApplied(t, stores, "shards a and b during c's outage", func(m map[string]int) bool {
		return m["a"]+m["b"] == (partitions-onC)*(before+during)
	})
	took := time.Since(outage)
	if want := onC * before; others["c"] != want {
		t.Fatalf("shard c holds %d records after its outage began, want the %d applied before it", others["c"], want)
	}
	t.Logf("during shard c's outage: %d records applied by shards a and b in %s, 0 by c (%d partitions of %d stalled)",
		(partitions-onC)*during, took.Round(time.Millisecond), onC, partitions)
	_, err = lock.ExecContext(t.Context(), `ROLLBACK`)
	must(t, err)
	waitApplied(t, stores, "every record after c is back", func(m map[string]int) bool { return m["a"]+m["b"]+m["c"] == partitions*(before+during) })
	stop()
	for _, n := range names3 {
		for part, cnt := range appliedOn(t, stores[n]) {
			if cnt != before+during {
				t.Errorf("shard %s holds %d rows of partition %d, want %d", n, cnt, part, before+during)
			}
		}
	}
}

// copyApplied copies partition k's applied rows from shard from into the new shard's
// transaction: the application's rows of the partition.
func copyApplied(stores map[string]*sqlitefence.Store) func(ctx context.Context, k fence.Key, from string, tx *sql.Tx) error {
	return func(ctx context.Context, k fence.Key, from string, tx *sql.Tx) error {
		rows, err := stores[from].DB().QueryContext(ctx, `SELECT off FROM applied WHERE p = ?`, k.Partition)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var off int64
			if err := rows.Scan(&off); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO applied (p, off) VALUES (?, ?)`, k.Partition, off); err != nil {
				return err
			}
		}
		return rows.Err()
	}
}

// TestConsumerFollowsAMove moves a partition from shard a to shard b while a running consumer
// applies records to it: the owner's write on a is refused by the retired fence, it waits for
// the publication and claims the partition on b, without a restart and without a recovery
// (RecoverRegressions is off: a move is not a regression), and every record is applied once:
// b holds all of the partition's rows, the copied ones and those applied after the move.
func TestConsumerFollowsAMove(t *testing.T) {
	const partitions, before, during = 6, 50, 200
	c, r, stores, group, brokers := shardedRun(t, partitions, before, consumer.RecoverRegressions(false))
	k := keyOn(t, r.Placement(), group, "a")
	k.Topic = "telemetry"
	for r.Placement().Shard(k) != "a" {
		k.Partition++
	}
	// The operator's own router: the consumer's holds placement 1 until its next claim.
	shards := map[string]Shard[*sql.Tx]{}
	for n, st := range stores {
		shards[n] = st
	}
	operator := newRouter(t, shards, SQLite(stores["a"].DB()))
	stop := run(t, c)
	total := func(m map[string]int) int { return m["a"] + m["b"] + m["c"] }
	waitApplied(t, stores, "the records before the move", func(m map[string]int) bool { return total(m) == partitions*before })
	produce(t, brokers, partitions, during/2)
	waitApplied(t, stores, "some records of the partition to move", func(map[string]int) bool {
		return appliedOn(t, stores["a"])[k.Partition] > before
	})
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		produce(t, brokers, partitions, during/2)
	}()
	must(t, operator.Move(t.Context(), k, "b", copyApplied(stores)))
	<-produced
	waitApplied(t, stores, "every record after the move", func(m map[string]int) bool {
		return total(m) == partitions*(before+during)+appliedOn(t, stores["a"])[k.Partition] // a keeps the rows it applied
	})
	if r.Placement().Shard(k) != "b" {
		t.Fatalf("the consumer's router places %s on %s after the move, want b", k, r.Placement().Shard(k))
	}
	stop()
	if got := appliedOn(t, stores["b"])[k.Partition]; got != before+during {
		t.Fatalf("shard b holds %d rows of the moved partition %d, want %d", got, k.Partition, before+during)
	}
	onA := appliedOn(t, stores["a"])[k.Partition]
	posA, err := stores["a"].Load(t.Context(), k)
	must(t, err)
	posB, err := stores["b"].Load(t.Context(), k)
	must(t, err)
	if int64(onA) != posA.Position+1 || posB.Position != before+during-1 {
		t.Fatalf("a holds %d rows of the moved partition and its fence %+v; b's fence %+v: want a's rows up to its retired position, b at %d",
			onA, posA, posB, before+during-1)
	}
	recs, err := stores["b"].Recoveries(t.Context(), k)
	must(t, err)
	for _, rec := range recs {
		if !strings.Contains(rec.Reason, "seed on b") && !strings.Contains(rec.Reason, "open on b") {
			t.Errorf("b records a recovery the move did not make: %+v", rec)
		}
	}
}
