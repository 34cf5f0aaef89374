package chaos

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/outbox"
)

// Workload is the keyed record stream every chaos run produces: Keys keys, each with PerKey
// records carrying the sequence numbers 0..PerKey-1 in order. Its fold is known in advance,
// so the checker can tell a lost update from a double apply.
//
// With CommandEvery > 0 (fenced mode only), every record whose sequence number is a multiple of
// it also sends a command to its device through the outbox, in the same fenced transaction; a
// receiver applies the commands through the inbox, and the checker verifies each arrived exactly
// once, in order.
type Workload struct {
	Keys         int
	PerKey       int
	CommandEvery int
	// CommandTopics routes the commands to this many destination topics (1, the default, or 2:
	// a key's commands alternate between them), all read by one receiver with one inbox.
	CommandTopics int
}

// Commands is the number of commands the workload sends per key.
func (w Workload) Commands() int {
	if w.CommandEvery <= 0 {
		return 0
	}
	return (w.PerKey + w.CommandEvery - 1) / w.CommandEvery
}

// CommandsFor returns the outbox messages the records of a batch send: one per record whose
// sequence number is a multiple of CommandEvery, to topic, keyed by the device.
func (w Workload) CommandsFor(topic string, recs []*kgo.Record) []outbox.Message {
	if w.CommandEvery <= 0 {
		return nil
	}
	var msgs []outbox.Message
	for _, r := range recs {
		seq, err := strconv.ParseInt(string(r.Value), 10, 64)
		if err == nil && seq%int64(w.CommandEvery) == 0 {
			msgs = append(msgs, outbox.Message{Topic: topic, Key: r.Key, Value: r.Value})
		}
	}
	return msgs
}

// Total is the number of records.
func (w Workload) Total() int { return w.Keys * w.PerKey }

// Validate reports a workload that cannot run.
func (w Workload) Validate() error {
	if w.Keys <= 0 || w.PerKey <= 0 {
		return fmt.Errorf("chaos: workload needs keys > 0 and records per key > 0, got %d and %d", w.Keys, w.PerKey)
	}
	if w.CommandTopics < 0 || w.CommandTopics > 2 {
		return fmt.Errorf("chaos: commands go to 1 or 2 destination topics, not %d", w.CommandTopics)
	}
	return nil
}

// Key names key number i.
func Key(i int) string { return fmt.Sprintf("k%05d", i) }

// Record returns the i-th record of the stream: keys round-robin, so each key's sequence
// numbers rise in production order.
func (w Workload) Record(topic string, i int) *kgo.Record {
	k, seq := i%w.Keys, i/w.Keys
	return &kgo.Record{Topic: topic, Key: []byte(Key(k)), Value: strconv.AppendInt(nil, int64(seq), 10)}
}

// Produce writes records [from, to) of the stream to topic, at most rate records per second
// (0: as fast as possible), and waits until all are acknowledged.
func (w Workload) Produce(ctx context.Context, cl *kgo.Client, topic string, from, to int, rate int) error {
	var firstErr error
	errc := make(chan error, 1)
	start := time.Now()
	for i := from; i < to; i++ {
		if rate > 0 {
			due := start.Add(time.Duration(i-from) * time.Second / time.Duration(rate))
			if d := time.Until(due); d > 0 {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(d):
				}
			}
		}
		cl.Produce(ctx, w.Record(topic, i), func(_ *kgo.Record, err error) {
			if err != nil {
				select {
				case errc <- err:
				default:
				}
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return err
	}
	select {
	case firstErr = <-errc:
	default:
	}
	return firstErr
}

// ProduceRounds produces the stream round by round (one record per key per round) at about
// rate records per second until stop is closed and at least minRounds rounds are out, always
// finishing the round it is in, so every key ends with the same count. It returns the rounds
// produced: the workload actually run is Workload{Keys: w.Keys, PerKey: rounds}. Only what the
// broker acknowledged counts; an error means the stream is incomplete.
func (w Workload) ProduceRounds(ctx context.Context, cl *kgo.Client, topic string, rate, minRounds int, stop <-chan struct{}) (int, error) {
	rounds := 0
	for {
		select {
		case <-stop:
			if rounds >= minRounds {
				return rounds, nil
			}
		default:
		}
		if err := w.Produce(ctx, cl, topic, rounds*w.Keys, (rounds+1)*w.Keys, rate); err != nil {
			return rounds, err
		}
		rounds++
	}
}

// ackCounter counts the records the harness's producer had acknowledged, per topic and per
// second since t0: the input the workers had to apply, for the report's backlog. It is the
// producer's client's hook (kgo.WithHooks).
type ackCounter struct {
	t0  time.Time
	mu  sync.Mutex
	per map[string][]int64
}

var _ kgo.HookProduceRecordUnbuffered = (*ackCounter)(nil)

// OnProduceRecordUnbuffered implements kgo.HookProduceRecordUnbuffered: a record the broker
// acknowledged counts in the second it was acknowledged in; a failed one does not.
func (a *ackCounter) OnProduceRecordUnbuffered(r *kgo.Record, err error) {
	if err != nil {
		return
	}
	s := max(int(time.Since(a.t0)/time.Second), 0)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.per == nil {
		a.per = map[string][]int64{}
	}
	c := a.per[r.Topic]
	if len(c) <= s {
		c = append(c, make([]int64, s+1-len(c))...)
	}
	c[s]++
	a.per[r.Topic] = c
}

// counts returns a copy of the counts so far (nil for a nil counter).
func (a *ackCounter) counts() map[string][]int64 {
	if a == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string][]int64, len(a.per))
	for t, c := range a.per {
		out[t] = slices.Clone(c)
	}
	return out
}

// Schema returns the workload's tables for a dialect: the per-key state the handler folds the
// records into, the log of applied batches (one row per committed batch, written in the same
// transaction: its offsets, token, worker, when it committed, at_ms, and when its oldest
// record was produced, produced_ms, the record's Kafka timestamp, 0 where unknown), the log
// of write attempts (written outside it, so refused attempts are seen), the log of injected
// faults, and what the topic faults (faults_topic.go) changed: each recreation or growth of a
// source topic with when it happened and when the harness, as the operator, released it
// (chaos_topic_changes), and the era each partition's new incarnation starts at
// (chaos_incarnations).
func Schema(d Dialect) string {
	id := "BIGSERIAL PRIMARY KEY"
	if d == SQLite {
		id = "INTEGER PRIMARY KEY AUTOINCREMENT"
	}
	return `
CREATE TABLE IF NOT EXISTS chaos_state (
	k TEXT PRIMARY KEY,
	n BIGINT NOT NULL,
	last_seq BIGINT NOT NULL,
	sum_seq BIGINT NOT NULL,
	disorder BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS chaos_applied (
	id ` + id + `,
	topic TEXT NOT NULL DEFAULT '',
	part INTEGER NOT NULL,
	first_off BIGINT NOT NULL,
	last_off BIGINT NOT NULL,
	era BIGINT NOT NULL,
	epoch BIGINT NOT NULL,
	worker TEXT NOT NULL,
	at_ms BIGINT NOT NULL,
	produced_ms BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS chaos_attempts (
	id ` + id + `,
	worker TEXT NOT NULL,
	topic TEXT NOT NULL DEFAULT '',
	part INTEGER NOT NULL,
	era BIGINT NOT NULL,
	epoch BIGINT NOT NULL,
	first_off BIGINT NOT NULL,
	last_off BIGINT NOT NULL,
	outcome TEXT NOT NULL,
	cause TEXT NOT NULL DEFAULT '',
	zombie BOOLEAN NOT NULL,
	resumed BOOLEAN NOT NULL DEFAULT FALSE,
	detail TEXT NOT NULL,
	at_ms BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS chaos_commands (
	id ` + id + `,
	k TEXT NOT NULL,
	seq BIGINT NOT NULL,
	topic TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS chaos_topic_changes (
	id ` + id + `,
	topic TEXT NOT NULL,
	kind TEXT NOT NULL,
	changed_ms BIGINT NOT NULL,
	released_ms BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS chaos_incarnations (
	topic TEXT NOT NULL,
	part INTEGER NOT NULL,
	era BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS chaos_faults (
	id ` + id + `,
	kind TEXT NOT NULL,
	target TEXT NOT NULL,
	detail TEXT NOT NULL,
	start_ms BIGINT NOT NULL,
	end_ms BIGINT NOT NULL
);`
}

// Migrate creates the workload's tables, and adds to a table an older Migrate created the
// columns it lacks (chaos_applied's produced_ms).
func Migrate(ctx context.Context, db DB) error {
	if db.Dialect() == SQLite {
		// One statement per Exec: database/sql drivers differ on multi-statement strings.
		for _, stmt := range splitStatements(Schema(SQLite)) {
			if err := db.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("chaos: migrate: %w", err)
			}
		}
		// SQLite's ALTER TABLE has no IF NOT EXISTS: look for the column first.
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM pragma_table_info('chaos_applied') WHERE name = 'produced_ms'`).Scan(&n); err != nil {
			return fmt.Errorf("chaos: migrate: %w", err)
		}
		if n == 0 {
			if err := db.Exec(ctx, `ALTER TABLE chaos_applied ADD COLUMN produced_ms BIGINT NOT NULL DEFAULT 0`); err != nil {
				return fmt.Errorf("chaos: migrate: %w", err)
			}
		}
		return nil
	}
	if err := db.Exec(ctx, Schema(Postgres)+`
ALTER TABLE chaos_applied ADD COLUMN IF NOT EXISTS produced_ms BIGINT NOT NULL DEFAULT 0;`); err != nil {
		return fmt.Errorf("chaos: migrate: %w", err)
	}
	return nil
}

func splitStatements(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == ';' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return out
}

type keyState struct{ n, last, sum, disorder int64 }

// errBadRecord marks a record that does not decode as a workload record.
var errBadRecord = errors.New("chaos: record is not a workload record")

// ApplyBatch folds a batch of one partition into the per-key state inside tx, as a deliberate
// read-modify-write (read the key's state, compute, write it back): the access pattern a lock
// is usually asked to protect, and the one that loses updates when two writers overlap. It
// also logs the batch with the writer's token in the same transaction.
func ApplyBatch(ctx context.Context, tx Tx, part int32, tok fence.Token, worker string, recs []*kgo.Record) error {
	if len(recs) == 0 {
		return nil
	}
	if err := fold(ctx, tx, recs); err != nil {
		return err
	}
	return logApplied(ctx, tx, recs[0].Topic, part, tok, worker, recs)
}

// fold folds records into the per-key state inside tx (ApplyBatch without the applied log).
func fold(ctx context.Context, tx Tx, recs []*kgo.Record) error {
	states := map[string]*keyState{}
	order := []string{}
	for _, r := range recs {
		seq, err := strconv.ParseInt(string(r.Value), 10, 64)
		if err != nil || len(r.Key) == 0 {
			return fmt.Errorf("%w: offset %d", errBadRecord, r.Offset)
		}
		k := string(r.Key)
		st, ok := states[k]
		if !ok {
			st = &keyState{last: -1}
			err := tx.QueryRow(ctx, `SELECT n, last_seq, sum_seq, disorder FROM chaos_state WHERE k = $1`, k).
				Scan(&st.n, &st.last, &st.sum, &st.disorder)
			if err != nil && !isNoRows(err) {
				return err
			}
			states[k] = st
			order = append(order, k)
		}
		if seq != st.last+1 {
			st.disorder++
		}
		st.n++
		st.sum += seq
		st.last = seq
	}
	for _, k := range order {
		st := states[k]
		err := tx.Exec(ctx, `INSERT INTO chaos_state (k, n, last_seq, sum_seq, disorder) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (k) DO UPDATE SET n = excluded.n, last_seq = excluded.last_seq, sum_seq = excluded.sum_seq, disorder = excluded.disorder`,
			k, st.n, st.last, st.sum, st.disorder)
		if err != nil {
			return err
		}
	}
	return nil
}

// logApplied logs a committed batch in the applied log, in the batch's transaction tx, with
// when its oldest record was produced (producedMS).
func logApplied(ctx context.Context, tx Tx, topic string, part int32, tok fence.Token, worker string, recs []*kgo.Record) error {
	return tx.Exec(ctx, `INSERT INTO chaos_applied (topic, part, first_off, last_off, era, epoch, worker, at_ms, produced_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		topic, part, recs[0].Offset, recs[len(recs)-1].Offset, tok.Era, tok.Epoch, worker, time.Now().UnixMilli(), producedMS(recs))
}

// producedMS returns when the oldest of recs was produced, in Unix milliseconds: the smallest
// Kafka timestamp among them (the first record's, as a producer writes a partition in order;
// the harness's producer stamps each record when it hands it over, CreateTime), 0 if none
// has one.
func producedMS(recs []*kgo.Record) int64 {
	var oldest int64
	for _, r := range recs {
		if r.Timestamp.IsZero() {
			continue
		}
		if ms := r.Timestamp.UnixMilli(); ms > 0 && (oldest == 0 || ms < oldest) {
			oldest = ms
		}
	}
	return oldest
}

func isNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) || errors.Is(err, sql.ErrNoRows) }
