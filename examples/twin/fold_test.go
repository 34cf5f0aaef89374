package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/outbox"
)

// TestFoldMatchesPerRecord: the fast fold (rows merged per device, one set-based upsert per
// batch) leaves the twins table and the outbox exactly as the per-record fold it replaced
// (one upsert per update), after every batch, on SQLite.
func TestFoldMatchesPerRecord(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	twins, gw, err := openSQLite(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer twins.close()
	defer gw.close()
	db := twins.sink.(*sqlitefence.Store).DB()
	compareFolds(ctx, t, twins, func(ctx context.Context) (*sql.Tx, func() error, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return nil, nil, err
		}
		return tx, tx.Commit, nil
	})
}

// TestFoldMatchesPerRecordPostgres is TestFoldMatchesPerRecord on the real PostgreSQL
// (BATON_POSTGRES_URL), in a schema of its own.
func TestFoldMatchesPerRecordPostgres(t *testing.T) {
	url := os.Getenv("BATON_POSTGRES_URL")
	if url == "" {
		t.Skip("BATON_POSTGRES_URL is not set")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	schema := fmt.Sprintf("twinfold_%08x", uint32(time.Now().UnixNano()))
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") //nolint:errcheck // cleanup
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := migratePostgres(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	st, err := pgStore(pool)
	if err != nil {
		t.Fatal(err)
	}
	compareFolds(ctx, t, st, func(ctx context.Context) (pgx.Tx, func() error, error) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return nil, nil, err
		}
		return tx, func() error { return tx.Commit(ctx) }, nil
	})
}

// foldBatches are the batches both folds apply: a device several times in one batch, with
// only reported, only desired or both kinds changing, devices new in a later batch, and
// random batches.
func foldBatches() [][]update {
	r := func(d string, seq int, temp float64) update { return update{d, "reported", temp, seq} }
	w := func(d string, seq int, temp float64) update { return update{d, "desired", temp, seq} }
	batches := [][]update{
		{r("a", 1, 19), r("a", 2, 19.5), w("a", 3, 21), w("b", 1, 20), r("a", 4, 18), w("b", 2, 20.5)},
		{r("c", 1, 17), w("a", 5, 22), w("a", 6, 22.5), r("b", 3, 19), r("c", 2, 17.5)},
		{r("a", 7, 18), r("a", 8, 18.5), r("a", 9, 19), w("b", 4, 21), r("b", 5, 20), w("b", 6, 21.5), w("c", 3, 20)},
		{w("d", 1, 23)},
	}
	rng := rand.New(rand.NewPCG(15, 15))
	seq := map[string]int{"a": 9, "b": 6, "c": 3, "d": 1}
	for range 5 {
		var b []update
		for range 40 {
			d := string(rune('a' + rng.IntN(5)))
			seq[d]++
			u := r(d, seq[d], 15+float64(rng.IntN(20))/2)
			if rng.IntN(3) == 0 {
				u.Kind = "desired"
			}
			b = append(b, u)
		}
		batches = append(batches, b)
	}
	return batches
}

// compareFolds applies foldBatches one by one with the per-record fold, then (on an empty
// table) with fold, and compares the tables after each batch and the commands appended.
func compareFolds[Tx any](ctx context.Context, t *testing.T, st *store[Tx], begin func(context.Context) (Tx, func() error, error)) {
	t.Helper()
	batches := foldBatches()
	run := func(h consumer.Handler[Tx]) []string {
		var snaps []string
		for i, us := range batches {
			b := &consumer.Batch{Key: fence.Key{Group: "g", Topic: "device-updates"}}
			for _, u := range us {
				v, err := json.Marshal(u)
				if err != nil {
					t.Fatal(err)
				}
				b.Records = append(b.Records, &kgo.Record{Key: []byte(u.Device), Value: v})
			}
			tx, commit, err := begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := h(ctx, tx, b); err != nil {
				t.Fatalf("batch %d: %v", i, err)
			}
			if err := commit(); err != nil {
				t.Fatal(err)
			}
			snaps = append(snaps, snapshot(ctx, t, st))
		}
		return snaps
	}
	var oneCmds, fastCmds []outbox.Message
	one := *st
	one.append = recordAppends[Tx](&oneCmds)
	oneSnaps := run(perRecordFold(&one, "cmds"))
	if err := st.db.Exec(ctx, "DELETE FROM twins"); err != nil {
		t.Fatal(err)
	}
	fast := *st
	fast.append = recordAppends[Tx](&fastCmds)
	fastSnaps := run(fold(&fast, "cmds"))
	for i := range oneSnaps {
		if fastSnaps[i] != oneSnaps[i] {
			t.Errorf("after batch %d the fast fold left\n%s\nthe per-record fold\n%s", i, fastSnaps[i], oneSnaps[i])
		}
	}
	if !reflect.DeepEqual(fastCmds, oneCmds) || len(oneCmds) == 0 {
		t.Errorf("the fast fold appended %d commands, the per-record fold %d, or they differ", len(fastCmds), len(oneCmds))
	}
	t.Logf("%d batches, last table:\n%s", len(batches), fastSnaps[len(fastSnaps)-1])
}

// recordAppends is an outbox append that records the messages instead (no fence to check).
func recordAppends[Tx any](into *[]outbox.Message) func(context.Context, Tx, fence.Key, fence.Token, ...outbox.Message) error {
	return func(_ context.Context, _ Tx, _ fence.Key, _ fence.Token, msgs ...outbox.Message) error {
		*into = append(*into, msgs...)
		return nil
	}
}

// perRecordFold is the fold before the fast path, the reference: one upsert per update.
func perRecordFold[Tx any](st *store[Tx], commands string) consumer.Handler[Tx] {
	return consumer.Handler[Tx](func(ctx context.Context, tx Tx, b *consumer.Batch) error {
		var cmds []outbox.Message
		for _, r := range b.Records {
			var u update
			if err := json.Unmarshal(r.Value, &u); err != nil {
				return b.Fail(r, err)
			}
			col := "reported"
			if u.Kind == "desired" {
				col = "desired"
			}
			if err := st.wrap(tx).Exec(ctx, `INSERT INTO twins (device, `+col+`, version, last_seq) VALUES ($1, $2, 1, $3)
ON CONFLICT (device) DO UPDATE SET `+col+` = excluded.`+col+`, version = twins.version + 1, last_seq = excluded.last_seq`,
				u.Device, u.Temp, u.Seq); err != nil {
				return err
			}
			if u.Kind == "desired" {
				v, err := json.Marshal(command{Device: u.Device, SetTemp: u.Temp})
				if err != nil {
					return err
				}
				cmds = append(cmds, outbox.Message{Topic: commands, Key: r.Key, Value: v})
			}
		}
		return st.append(ctx, tx, b.Key, b.Token, cmds...)
	})
}

// snapshot is the twins table as text, NULLs included.
func snapshot[Tx any](ctx context.Context, t *testing.T, st *store[Tx]) string {
	t.Helper()
	rows, err := st.db.Query(ctx, `SELECT device, reported, desired, version, last_seq FROM twins ORDER BY device`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var s string
	for rows.Next() {
		var d string
		var rep, des *float64
		var v, seq int64
		if err := rows.Scan(&d, &rep, &des, &v, &seq); err != nil {
			t.Fatal(err)
		}
		f := func(p *float64) string {
			if p == nil {
				return "NULL"
			}
			return fmt.Sprint(*p)
		}
		s += fmt.Sprintf("%s %s %s %d %d\n", d, f(rep), f(des), v, seq)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return s
}

// BenchmarkFold compares the two folds side by side on a batch of 500 updates of the demo's
// 8 devices, on SQLite and (with BATON_POSTGRES_URL) PostgreSQL: read the ratio, not the times.
func BenchmarkFold(b *testing.B) {
	ctx := context.Background()
	var recs []*kgo.Record
	for i := range 500 {
		u := update{Device: fmt.Sprintf("d-%02d", i%devices), Kind: "reported", Temp: 20, Seq: i}
		if i%3 == 0 {
			u.Kind = "desired"
		}
		v, _ := json.Marshal(u)
		recs = append(recs, &kgo.Record{Key: []byte(u.Device), Value: v})
	}
	bench := func(b *testing.B, run func(h string) error) {
		for _, h := range []string{"per-record", "fast"} {
			b.Run(h, func(b *testing.B) {
				for b.Loop() {
					if err := run(h); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
	b.Run("sqlite", func(b *testing.B) {
		twins, gw, err := openSQLite(ctx, b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		defer twins.close()
		defer gw.close()
		var cmds []outbox.Message
		st := *twins
		st.append = recordAppends[*sql.Tx](&cmds)
		db := twins.sink.(*sqlitefence.Store).DB()
		bench(b, func(h string) error {
			hd := fold(&st, "cmds")
			if h == "per-record" {
				hd = perRecordFold(&st, "cmds")
			}
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback() //nolint:errcheck // after a commit
			cmds = cmds[:0]
			if err := hd(ctx, tx, &consumer.Batch{Records: recs}); err != nil {
				return err
			}
			return tx.Commit()
		})
	})
	b.Run("postgres", func(b *testing.B) {
		url := os.Getenv("BATON_POSTGRES_URL")
		if url == "" {
			b.Skip("BATON_POSTGRES_URL is not set")
		}
		schema := fmt.Sprintf("twinfold_%08x", uint32(time.Now().UnixNano()))
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
			b.Fatal(err)
		}
		defer conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE") //nolint:errcheck // cleanup
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			b.Fatal(err)
		}
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		defer pool.Close()
		if err := migratePostgres(ctx, pool, ""); err != nil {
			b.Fatal(err)
		}
		twins, err := pgStore(pool)
		if err != nil {
			b.Fatal(err)
		}
		var cmds []outbox.Message
		st := *twins
		st.append = recordAppends[pgx.Tx](&cmds)
		bench(b, func(h string) error {
			hd := fold(&st, "cmds")
			if h == "per-record" {
				hd = perRecordFold(&st, "cmds")
			}
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx) //nolint:errcheck // after a commit
			cmds = cmds[:0]
			if err := hd(ctx, tx, &consumer.Batch{Records: recs}); err != nil {
				return err
			}
			return tx.Commit(ctx)
		})
	})
}
