package chaos

import (
	"context"
	"database/sql"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// workloadDBs are the run databases the workload's tests run on: SQLite's, and PostgreSQL's
// in a schema of its own (skipped without one). Each returns the database unmigrated.
var workloadDBs = []struct {
	name string
	db   func(*testing.T) DB
}{
	{"SQLite", func(t *testing.T) DB {
		sdb, err := sql.Open("sqlite", "file://"+filepath.Join(t.TempDir(), "chaos.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sdb.Close() })
		return SQLDB(sdb)
	}},
	{"PostgreSQL", func(t *testing.T) DB {
		pool, _ := testenv.Postgres(t)
		return PgDB(pool)
	}},
}

// appliedProduced returns the produced_ms of the applied log's rows, in order.
func appliedProduced(t *testing.T, db DB) []int64 {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT produced_ms FROM chaos_applied ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var n int64
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		out = append(out, n)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// A batch committed through ApplyBatch logs when its oldest record was produced: the Kafka
// timestamp of its first record (the smallest of its records'), and 0 when its records carry
// none; at_ms is when it committed.
func TestWorkloadAppliedLogsProducedTime(t *testing.T) {
	for _, c := range workloadDBs {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			db := c.db(t)
			if err := Migrate(ctx, db); err != nil {
				t.Fatal(err)
			}
			base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
			rec := func(off int64, seq string, ts time.Time) *kgo.Record {
				return &kgo.Record{Topic: "t", Key: []byte("k00000"), Value: []byte(seq), Offset: off, Timestamp: ts}
			}
			batches := [][]*kgo.Record{
				// In production order: the first record is the oldest, the last the newest.
				{rec(0, "0", base.Add(1000*time.Millisecond)), rec(1, "1", base.Add(1500*time.Millisecond)), rec(2, "2", base.Add(1700*time.Millisecond))},
				// The oldest is not always first (another producer's record): the smallest counts.
				{rec(3, "3", base.Add(2500*time.Millisecond)), rec(4, "4", base.Add(2200*time.Millisecond))},
				// No timestamp: unknown.
				{rec(5, "5", time.Time{})},
			}
			before := time.Now().UnixMilli()
			for _, recs := range batches {
				tx, commit, rollback, err := db.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if err := ApplyBatch(ctx, tx, 0, fence.Token{Epoch: 1}, "w1", recs); err != nil {
					_ = rollback(ctx)
					t.Fatal(err)
				}
				if err := commit(ctx); err != nil {
					t.Fatal(err)
				}
			}
			want := []int64{base.Add(1000 * time.Millisecond).UnixMilli(), base.Add(2200 * time.Millisecond).UnixMilli(), 0}
			if got := appliedProduced(t, db); !slices.Equal(got, want) {
				t.Errorf("produced_ms %v, want %v", got, want)
			}
			var at int64
			if err := db.QueryRow(ctx, `SELECT min(at_ms) FROM chaos_applied`).Scan(&at); err != nil || at < before {
				t.Errorf("at_ms %d (%v), want the commit's time, at least %d", at, err, before)
			}
		})
	}
}

// Migrate adds produced_ms to an applied log an older Migrate created without it, keeping its
// rows (their produced time unknown, 0), and runs again on a migrated database.
func TestWorkloadMigrateAddsProducedColumn(t *testing.T) {
	for _, c := range workloadDBs {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			db := c.db(t)
			id := "BIGSERIAL PRIMARY KEY"
			if db.Dialect() == SQLite {
				id = "INTEGER PRIMARY KEY AUTOINCREMENT"
			}
			if err := db.Exec(ctx, `CREATE TABLE chaos_applied (id `+id+`, topic TEXT NOT NULL DEFAULT '', part INTEGER NOT NULL,
first_off BIGINT NOT NULL, last_off BIGINT NOT NULL, era BIGINT NOT NULL, epoch BIGINT NOT NULL, worker TEXT NOT NULL, at_ms BIGINT NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			if err := db.Exec(ctx, `INSERT INTO chaos_applied (topic, part, first_off, last_off, era, epoch, worker, at_ms) VALUES ('t', 0, 0, 9, 0, 1, 'w1', 5000)`); err != nil {
				t.Fatal(err)
			}
			for range 2 {
				if err := Migrate(ctx, db); err != nil {
					t.Fatal(err)
				}
			}
			if err := db.Exec(ctx, `INSERT INTO chaos_applied (topic, part, first_off, last_off, era, epoch, worker, at_ms, produced_ms) VALUES ('t', 0, 10, 19, 0, 1, 'w1', 6000, 5500)`); err != nil {
				t.Fatal(err)
			}
			if got, want := appliedProduced(t, db), []int64{0, 5500}; !slices.Equal(got, want) {
				t.Errorf("produced_ms %v, want %v", got, want)
			}
		})
	}
}

// The Redis sink's applied log carries each batch's produced time into chaos_applied
// (mirrorRedis); an entry written without it reads as unknown, 0.
func TestWorkloadRedisAppliedKeepsProducedTime(t *testing.T) {
	ts := time.UnixMilli(1_700_000_000_123)
	recs := []*kgo.Record{{Topic: "t", Offset: 40, Timestamp: ts}, {Topic: "t", Offset: 41, Timestamp: ts.Add(time.Second)}}
	fv := redisApplied("t", 3, fence.Token{Era: 2, Epoch: 7}, "w4", recs, 1_700_000_009_000)
	entry := func(fv []string) redis.XMessage {
		m := redis.XMessage{ID: "1-0", Values: map[string]any{}}
		for i := 0; i+1 < len(fv); i += 2 {
			m.Values[fv[i]] = fv[i+1]
		}
		return m
	}
	got, err := parseRedisApplied(entry(fv))
	if err != nil {
		t.Fatal(err)
	}
	want := appliedRow{topic: "t", worker: "w4", part: 3, first: 40, last: 41, era: 2, epoch: 7, at: 1_700_000_009_000, produced: ts.UnixMilli()}
	if got != want {
		t.Errorf("entry reads %+v, want %+v", got, want)
	}
	var old []string
	for i := 0; i < len(fv); i += 2 {
		if fv[i] != "produced_ms" {
			old = append(old, fv[i], fv[i+1])
		}
	}
	want.produced = 0
	if got, err := parseRedisApplied(entry(old)); err != nil || got != want {
		t.Errorf("entry without produced_ms reads %+v (%v), want %+v", got, err, want)
	}
	if _, err := parseRedisApplied(entry(fv[:len(fv)-4])); err == nil || !strings.Contains(err.Error(), "at_ms") {
		t.Errorf("entry without at_ms: %v, want an error naming it", err)
	}
}

// The sharded sink's applied logs are copied into the run's with each batch's produced time
// (insertApplied, as copyApplied and mirrorShards use it).
func TestWorkloadShardCopyKeepsProducedTime(t *testing.T) {
	ctx := context.Background()
	pool, _ := testenv.Postgres(t)
	db := PgDB(pool)
	if err := Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	h := &harness{db: db}
	rows := []appliedRow{
		{topic: "t", worker: "w1", part: 0, first: 0, last: 9, epoch: 1, at: 5000, produced: 4200},
		{topic: "t", worker: "w2", part: 1, first: 0, last: 4, epoch: 1, at: 5100},
	}
	if err := h.insertApplied(ctx, rows); err != nil {
		t.Fatal(err)
	}
	if got, want := appliedProduced(t, db), []int64{4200, 0}; !slices.Equal(got, want) {
		t.Errorf("produced_ms %v, want %v", got, want)
	}
}

// The producer's hook counts each record the broker acknowledged, per topic, in the second
// since the run's start it was acknowledged in; a record that failed does not count.
func TestWorkloadAckCounter(t *testing.T) {
	a := &ackCounter{t0: time.Now().Add(-3 * time.Second)}
	a.OnProduceRecordUnbuffered(&kgo.Record{Topic: "t"}, nil)
	a.OnProduceRecordUnbuffered(&kgo.Record{Topic: "t"}, nil)
	a.OnProduceRecordUnbuffered(&kgo.Record{Topic: "t"}, context.DeadlineExceeded)
	a.OnProduceRecordUnbuffered(&kgo.Record{Topic: "u"}, nil)
	got := a.counts()
	if !slices.Equal(got["t"], []int64{0, 0, 0, 2}) || !slices.Equal(got["u"], []int64{0, 0, 0, 1}) || len(got) != 2 {
		t.Errorf("counts %v, want t: 2 and u: 1 in second 3", got)
	}
	got["t"][3] = 99
	if a.counts()["t"][3] != 2 {
		t.Error("counts shares its slices with the counter")
	}
	if (*ackCounter)(nil).counts() != nil {
		t.Error("a nil counter counts something")
	}

	// As a client's hook, it counts what Produce got acknowledged.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "chaos"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	b := &ackCounter{t0: time.Now()}
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.WithHooks(b))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	w := Workload{Keys: 5, PerKey: 4}
	if err := w.Produce(context.Background(), cl, "chaos", 0, w.Total(), 0); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, c := range b.counts()["chaos"] {
		n += c
	}
	if n != int64(w.Total()) {
		t.Errorf("%d records counted, want %d", n, w.Total())
	}
}
