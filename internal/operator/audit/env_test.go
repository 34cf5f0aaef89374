package audit_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/internal/operator/audit"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/pgoutbox"
	"github.com/batonhq/baton/outbox/sqliteoutbox"
)

// env is one group's world for a test: a store (SQLite with kfake, or PostgreSQL with the real
// broker), a source topic with one partition, an output topic, and the hands that write Baton's
// records through the stores' own APIs or corrupt them by hand.
type env struct {
	name          string
	brokers       []string
	store         string // the auditor's -store
	group         string
	src, dest     string
	key           fence.Key
	cl            *kgo.Client
	adm           *kadm.Client
	relay         *outbox.Relay
	claim         func(t *testing.T, tok fence.Token)
	claimAs       func(t *testing.T, tok fence.Token, claimant string)
	apply         func(t *testing.T, tok fence.Token, first, last int64, msgs ...outbox.Message)
	admit         func(t *testing.T, scope, id string, tok fence.Token, seq int64)
	exec          func(t *testing.T, query string, args ...any) // by hand; $n placeholders
	grp, fenceTbl string                                        // the group column's name and the tables
	outboxTbl     string
	log           lockedBuffer // the auditor's log
	run           func(ctx context.Context, t *testing.T) (wait func())
	topics        fence.Topics             // the store's topic identities, for a reset
	delivered     func(t *testing.T) int64 // the source partition's delivered outbox sequence
}

// lockedBuffer is a log sink safe for the auditor's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// both runs body on SQLite with kfake and on PostgreSQL with the real broker (skipped, or failed
// in CI, when the services are not configured).
func both(t *testing.T, body func(t *testing.T, e *env)) {
	t.Run("sqlite", func(t *testing.T) { body(t, sqliteEnv(t)) })
	t.Run("postgres", func(t *testing.T) { body(t, pgEnv(t)) })
}

func (e *env) kafka(t *testing.T, brokers []string) {
	e.brokers = brokers
	e.group = testenv.UniqueName("audit")
	e.src = testenv.NewTopic(t, brokers, 1)
	e.dest = testenv.NewTopic(t, brokers, 2)
	e.key = fence.Key{Group: e.group, Topic: e.src, Partition: 0}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(e.src), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	e.cl, e.adm = cl, kadm.NewClient(cl)
}

func sqliteEnv(t *testing.T) *env {
	e := &env{name: "sqlite", grp: "grp", fenceTbl: "baton_fences", outboxTbl: "baton_outbox"}
	e.kafka(t, testenv.FakeKafka(t))
	e.store = filepath.Join(t.TempDir(), "baton.db")
	fs, err := sqlitefence.Open(e.store)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Close() })
	box, err := sqliteoutbox.New(fs)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := fs.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := box.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	e.relay = newRelay(t, e, box)
	e.run = func(ctx context.Context, t *testing.T) func() { return runClean(ctx, t, e, fs, fs, box) }
	e.topics = fs
	e.delivered = func(t *testing.T) int64 {
		var n int64
		if err := fs.DB().QueryRowContext(ctx, `SELECT coalesce(max(delivered_seq), 0) FROM baton_outbox_cursors WHERE grp = ?`, e.group).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	e.claimAs = func(t *testing.T, tok fence.Token, claimant string) {
		t.Helper()
		if _, err := fs.Claim(ctx, e.key, tok, claimant); err != nil {
			t.Fatalf("claim %v: %v", tok, err)
		}
	}
	e.claim = func(t *testing.T, tok fence.Token) { t.Helper(); e.claimAs(t, tok, "test") }
	e.apply = func(t *testing.T, tok fence.Token, first, last int64, msgs ...outbox.Message) {
		t.Helper()
		if err := fs.Apply(ctx, e.key, tok, first, last, func(ctx context.Context, tx *sql.Tx) error {
			if len(msgs) == 0 {
				return nil
			}
			return box.Append(ctx, tx, e.key, tok, msgs...)
		}); err != nil {
			t.Fatalf("apply %d..%d: %v", first, last, err)
		}
	}
	e.admit = func(t *testing.T, scope, id string, tok fence.Token, seq int64) {
		t.Helper()
		tx, err := fs.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := fs.Admit(ctx, tx, scope, id, tok, seq); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	e.exec = func(t *testing.T, query string, args ...any) {
		t.Helper()
		for i := len(args); i >= 1; i-- {
			query = strings.ReplaceAll(query, fmt.Sprintf("$%d", i), fmt.Sprintf("?%d", i))
		}
		if _, err := fs.DB().ExecContext(ctx, query, args...); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
	}
	return e
}

func pgEnv(t *testing.T) *env {
	e := &env{name: "postgres", grp: "group_id", fenceTbl: "baton_fences", outboxTbl: "baton_outbox"}
	url := testenv.PostgresURL(t)
	e.kafka(t, testenv.KafkaBrokers(t))
	pool, schema := testenv.Postgres(t)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	e.store = url + sep + "search_path=" + schema
	fs, err := pgfence.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	box, err := pgoutbox.New(pool, fs)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := fs.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := box.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	e.relay = newRelay(t, e, box)
	e.run = func(ctx context.Context, t *testing.T) func() { return runClean(ctx, t, e, fs, fs, box) }
	e.topics = fs
	e.delivered = func(t *testing.T) int64 {
		var n int64
		if err := pool.QueryRow(ctx, `SELECT coalesce(max(delivered_seq), 0) FROM baton_outbox_cursors WHERE group_id = $1`, e.group).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	e.claimAs = func(t *testing.T, tok fence.Token, claimant string) {
		t.Helper()
		if _, err := fs.Claim(ctx, e.key, tok, claimant); err != nil {
			t.Fatalf("claim %v: %v", tok, err)
		}
	}
	e.claim = func(t *testing.T, tok fence.Token) { t.Helper(); e.claimAs(t, tok, "test") }
	e.apply = func(t *testing.T, tok fence.Token, first, last int64, msgs ...outbox.Message) {
		t.Helper()
		if err := fs.Apply(ctx, e.key, tok, first, last, func(ctx context.Context, tx pgx.Tx) error {
			if len(msgs) == 0 {
				return nil
			}
			return box.Append(ctx, tx, e.key, tok, msgs...)
		}); err != nil {
			t.Fatalf("apply %d..%d: %v", first, last, err)
		}
	}
	e.admit = func(t *testing.T, scope, id string, tok fence.Token, seq int64) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := fs.Admit(ctx, tx, scope, id, tok, seq)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	e.exec = func(t *testing.T, query string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, query, args...); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
	}
	return e
}

func newRelay(t *testing.T, e *env, store outbox.Store) *outbox.Relay {
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	r, err := outbox.NewRelay(cl, store)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// produce writes n records to the source partition and returns the high watermark.
func (e *env) produce(t *testing.T, n int) int64 {
	t.Helper()
	var last int64
	for i := range n {
		r := e.cl.ProduceSync(context.Background(), &kgo.Record{Partition: 0, Key: []byte(fmt.Sprint("k", i)), Value: []byte("v")})
		if err := r.FirstErr(); err != nil {
			t.Fatal(err)
		}
		last = r[0].Record.Offset
	}
	return last + 1
}

// flush relays the pending outbox rows under tok.
func (e *env) flush(t *testing.T, tok fence.Token) int {
	t.Helper()
	n, err := e.relay.Flush(context.Background(), e.key, tok)
	if err != nil {
		t.Fatalf("flush: %v", err)
	}
	return n
}

// msgs returns n outbox messages to the output topic.
func (e *env) msgs(n int) []outbox.Message {
	out := make([]outbox.Message, n)
	for i := range out {
		out[i] = outbox.Message{Topic: e.dest, Key: []byte(fmt.Sprint("d", i)), Value: []byte("cmd")}
	}
	return out
}

// clock is a settable clock for the auditor.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// auditor returns an auditor of e's group over its output topic, with a settable clock, logging
// into e.log.
func (e *env) auditor(t *testing.T, mod ...func(*audit.Config)) (*audit.Auditor, *clock) {
	t.Helper()
	c := &clock{t: time.Now()}
	cfg := audit.Config{Brokers: e.brokers, Store: e.store, Group: e.group, OutputTopics: []string{e.dest},
		Timeout: 5 * time.Second, Stall: time.Minute, OutboxAge: time.Minute, Now: c.now,
		Logger: slog.New(slog.NewJSONHandler(&e.log, nil))}
	for _, m := range mod {
		m(&cfg)
	}
	a, err := audit.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return a, c
}

// pass makes one pass, failing the test if a source could not be read.
func pass(t *testing.T, a *audit.Auditor) *audit.Report {
	t.Helper()
	r, err := a.Pass(context.Background())
	if err != nil {
		t.Fatalf("pass: %v", err)
	}
	return r
}

// clean asserts that a pass finds nothing.
func clean(t *testing.T, a *audit.Auditor, when string) *audit.Report {
	t.Helper()
	r := pass(t, a)
	if len(r.Violations) != 0 {
		t.Fatalf("%s: violations %v, want none", when, r.Violations)
	}
	return r
}

// within asserts that one of the next two passes finds a violation of check c saying what, and
// logged it at ERROR with the same evidence; it returns the evidence.
func within(t *testing.T, e *env, a *audit.Auditor, c audit.Check, what string) map[string]any {
	t.Helper()
	var got []audit.Violation
	for range 2 {
		r := pass(t, a)
		got = append(got, r.Violations...)
		for _, v := range r.Violations {
			if v.Check == c && strings.Contains(v.What, what) {
				ev := map[string]any{}
				for _, f := range v.Evidence {
					ev[f.Name] = f.Value
				}
				logged(t, e, v)
				return ev
			}
		}
	}
	t.Fatalf("no %s violation %q within two passes; found %v", c, what, got)
	return nil
}

// is asserts an evidence field's value.
func is(t *testing.T, ev map[string]any, name string, want any) {
	t.Helper()
	if got := fmt.Sprint(ev[name]); got != fmt.Sprint(want) {
		t.Errorf("evidence %s = %s, want %v (evidence %v)", name, got, want, ev)
	}
}

// logged asserts that v was logged at ERROR with its check, partition and evidence.
func logged(t *testing.T, e *env, v audit.Violation) {
	t.Helper()
	for _, line := range strings.Split(e.log.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) != nil || m["level"] != "ERROR" || !strings.Contains(fmt.Sprint(m["msg"]), v.What) {
			continue
		}
		ok := m["check"] == string(v.Check) && (v.Topic == "" || m["topic"] == v.Topic && fmt.Sprint(m["partition"]) == fmt.Sprint(v.Partition))
		for _, f := range v.Evidence {
			if _, has := m[f.Name]; !has {
				ok = false
			}
		}
		if ok {
			return
		}
	}
	t.Errorf("violation %v not logged with its evidence; log:\n%s", v, e.log.String())
}
