package shard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// The application's tables in every shard: one row per applied record, and per device the
// offset of its last record, to check the order of each key.
const pgAppSchema = `CREATE TABLE IF NOT EXISTS applied (p integer NOT NULL, off bigint NOT NULL, PRIMARY KEY (p, off));
CREATE TABLE IF NOT EXISTS devices (p integer NOT NULL, device text NOT NULL, last bigint NOT NULL, PRIMARY KEY (p, device));
CREATE TABLE IF NOT EXISTS disorder (p integer NOT NULL, device text NOT NULL, off bigint NOT NULL, last bigint NOT NULL)`

// copyPG copies partition k's rows of the application's tables from shard from (read through
// its pool: nothing of k changes there once its fence is retired) into the new shard's
// transaction.
func copyPG(pools map[string]*pgxpool.Pool) func(ctx context.Context, k fence.Key, from string, tx pgx.Tx) error {
	return func(ctx context.Context, k fence.Key, from string, tx pgx.Tx) error {
		src := pools[from]
		var offs []int64
		rows, err := src.Query(ctx, `SELECT off FROM applied WHERE p = $1`, k.Partition)
		if err != nil {
			return err
		}
		offs, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO applied (p, off) SELECT $1, unnest($2::bigint[])`, k.Partition, offs); err != nil {
			return err
		}
		type dev struct {
			Device string
			Last   int64
		}
		rows, err = src.Query(ctx, `SELECT device, last FROM devices WHERE p = $1`, k.Partition)
		if err != nil {
			return err
		}
		devs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[dev])
		if err != nil {
			return err
		}
		for _, d := range devs {
			if _, err := tx.Exec(ctx, `INSERT INTO devices (p, device, last) VALUES ($1, $2, $3)
				ON CONFLICT (p, device) DO UPDATE SET last = excluded.last`, k.Partition, d.Device, d.Last); err != nil {
				return err
			}
		}
		return nil
	}
}

func countPG(t *testing.T, pool *pgxpool.Pool, q string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(t.Context(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestMoveUnderLoadPostgres runs a consumer group of two members on real Kafka over a router
// of three PostgreSQL shards (the clusters of BATON_POSTGRES_SHARD_URLS, else three schemas on
// BATON_POSTGRES_URL) and moves one partition to another shard while records flow. A frozen
// member of the old placement (a goroutine holding a batch of that partition under the
// owner's token, its router reading placement 1 for ever) resumes after the publication and
// tries to write through placement 1 (the old shard) and through a fresh placement (the new
// shard): refused on both. Every record is applied once, in order per device, the moved
// partition's on the new shard after the move.
func TestMoveUnderLoadPostgres(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	const partitions, perPhase, devicesPer = 6, 300, 5
	shards, pools, pl := pgShards(t, names3...)
	for _, p := range pools {
		if _, err := p.Exec(t.Context(), pgAppSchema); err != nil {
			t.Fatal(err)
		}
	}
	topic := testenv.NewTopic(t, brokers, partitions)
	group := testenv.UniqueName("shard-move")
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	must(t, err)
	defer prod.Close()
	produced := 0 // records produced: the flow's goroutine adds to it until flowing is closed
	producePhase := func(n int) {
		var recs []*kgo.Record
		for p := range int32(partitions) {
			for i := range n {
				recs = append(recs, &kgo.Record{Partition: p, Key: fmt.Appendf(nil, "d%d", i%devicesPer), Value: []byte("x")})
			}
		}
		must(t, prod.ProduceSync(t.Context(), recs...).FirstErr())
		produced += len(recs)
	}
	handler := func(ctx context.Context, tx pgx.Tx, b *consumer.Batch) error {
		for _, rec := range b.Records {
			if _, err := tx.Exec(ctx, `INSERT INTO applied (p, off) VALUES ($1, $2)`, rec.Partition, rec.Offset); err != nil {
				return err
			}
			var last int64 = -1
			err := tx.QueryRow(ctx, `SELECT last FROM devices WHERE p = $1 AND device = $2`, rec.Partition, string(rec.Key)).Scan(&last)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			if last >= rec.Offset {
				if _, err := tx.Exec(ctx, `INSERT INTO disorder VALUES ($1, $2, $3, $4)`, rec.Partition, string(rec.Key), rec.Offset, last); err != nil {
					return err
				}
			}
			if _, err := tx.Exec(ctx, `INSERT INTO devices (p, device, last) VALUES ($1, $2, $3)
				ON CONFLICT (p, device) DO UPDATE SET last = excluded.last`, rec.Partition, string(rec.Key), rec.Offset); err != nil {
				return err
			}
		}
		return nil
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	var routers []Router[pgx.Tx]
	for range 2 {
		r := newRouter(t, shards, pl)
		routers = append(routers, r)
		c, err := consumer.New(group, []string{topic}, r, handler,
			consumer.Kafka(kgo.SeedBrokers(brokers...)), consumer.Logger(slog.New(slog.DiscardHandler)),
			consumer.RetryBackoff(20*time.Millisecond, 500*time.Millisecond))
		must(t, err)
		wg.Go(func() { errs <- c.Run(ctx) })
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	}
	defer stop()

	total := func() int {
		n := 0
		for _, p := range pools {
			n += countPG(t, p, `SELECT count(*) FROM applied`)
		}
		return n
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	operator := newRouter(t, shards, pl)
	k := keyOn(t, operator.Placement(), group, "a")
	k.Topic = topic
	for operator.Placement().Shard(k) != "a" {
		k.Partition++
	}
	producePhase(perPhase)
	waitFor("the first records", func() bool { return total() == produced })

	// The frozen member: the owner's token on a, read while it owns the partition, and a
	// batch of the partition in hand (the next offset), under placement 1 for ever.
	live, err := shards["a"].Load(t.Context(), k)
	must(t, err)
	if live.Claimant == "" || live.Position != perPhase-1 {
		t.Fatalf("fence of %s on a = %+v, want claimed by a member at position %d", k, live, perPhase-1)
	}
	frozenHome := &unreachable{Placements: pl}
	frozen := newRouter(t, shards, frozenHome)
	frozenHome.down = true
	resume := make(chan struct{})
	type attempt struct {
		via string
		at  time.Time
		err error
	}
	attempts := make(chan attempt, 2)
	var zombie sync.WaitGroup
	zombie.Go(func() {
		<-resume
		for _, via := range []Router[pgx.Tx]{frozen, operator} {
			name := via.Placement().Shard(k)
			err := via.Apply(t.Context(), k, live.Token, perPhase, perPhase, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO disorder VALUES ($1, 'zombie', $2, -1)`, k.Partition, perPhase)
				return err
			})
			attempts <- attempt{via: name, at: time.Now(), err: err}
		}
	})

	// Records flow while the partition moves, and after.
	moved, flowing := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(flowing)
		for {
			producePhase(devicesPer * 4)
			select {
			case <-moved:
				producePhase(perPhase) // after the publication
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	waitFor("records of the partition to move applied after the first", func() bool {
		return countPG(t, pools["a"], `SELECT count(*) FROM applied WHERE p = $1`, k.Partition) > perPhase
	})
	must(t, operator.Move(t.Context(), k, "b", copyPG(pools)))
	published := time.Now()
	close(moved)
	close(resume)
	zombie.Wait()
	close(attempts)
	seen := map[string]bool{}
	for a := range attempts {
		seen[a.via] = true
		if !a.at.After(published) {
			t.Errorf("the frozen member's write through %s was attempted before the publication", a.via)
		}
		if !errors.Is(a.err, fence.ErrStale) {
			t.Errorf("the frozen member's write on %s = %v, want refused as stale", a.via, a.err)
		}
	}
	if !seen["a"] || !seen["b"] {
		t.Fatalf("the frozen member tried shards %v, want a (its placement) and b (a fresh one)", seen)
	}
	<-flowing
	onA := countPG(t, pools["a"], `SELECT count(*) FROM applied WHERE p = $1`, k.Partition)
	waitFor("every record after the move", func() bool { return total() == produced+onA })
	stop()

	for _, n := range names3 {
		if d := countPG(t, pools[n], `SELECT count(*) FROM disorder`); d != 0 {
			t.Errorf("shard %s recorded %d records out of order per device, or the frozen member's write", n, d)
		}
	}
	for p := range int32(partitions) {
		pk := fence.Key{Group: group, Topic: topic, Partition: p}
		on := operator.Placement().Shard(pk)
		want := produced / partitions
		got := countPG(t, pools[on], `SELECT count(*) FROM applied WHERE p = $1`, p)
		distinct := countPG(t, pools[on], `SELECT count(DISTINCT off) FROM applied WHERE p = $1 AND off < $2`, p, want)
		if got != want || distinct != want {
			t.Errorf("partition %d on shard %s: %d rows, %d distinct offsets below %d; want %d, each once", p, on, got, distinct, want, want)
		}
	}
	if on := operator.Placement().Shard(k); on != "b" {
		t.Fatalf("%s on %s after the move, want b", k, on)
	}
	followed := 0
	for _, r := range routers {
		if r.Placement().Version == 2 {
			followed++
		}
	}
	if followed == 0 {
		t.Errorf("no member's router read placement 2: the partition's owner claimed it on b through a placement it never read")
	}
	if onB := countPG(t, pools["b"], `SELECT count(*) FROM applied WHERE p = $1`, k.Partition); onB <= onA {
		t.Errorf("b holds %d rows of the moved partition, a %d: want records applied on b after the move", onB, onA)
	}
	t.Logf("moved %s from a (%d of its records applied there) to b under load; %d records in all", k, onA, produced)
}
