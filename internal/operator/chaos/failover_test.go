package chaos_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/memfence"
	"github.com/batonhq/baton/internal/operator/audit"
	"github.com/batonhq/baton/internal/operator/chaos"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/pgoutbox"
)

// replicaScript runs deploy/local/postgres-replica.sh (a primary with a streaming standby of
// its own, on its own ports) with PG_STANDBY=mode and returns its output.
func replicaScript(t *testing.T, mode string, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(deployDir(t), "postgres-replica.sh"), args...)
	cmd.Env = append(os.Environ(), "PG_STANDBY="+mode)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("postgres-replica.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// replica starts a primary with a standby in mode (sync or async), deleted when the test
// ends, and returns its multi-host URL and the environment that points postgres.sh at it. It
// runs where deploy/local's PostgreSQL does (the tests' exported one says the server binaries
// are installed).
func replica(t *testing.T, mode string) (url string, scriptEnv []string) {
	t.Helper()
	testenv.PostgresURL(t)
	t.Cleanup(func() {
		cmd := exec.Command(filepath.Join(deployDir(t), "postgres-replica.sh"), "reset")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("postgres-replica.sh reset: %v\n%s", err, out)
		}
	})
	replicaScript(t, mode, "start")
	for _, line := range strings.Split(replicaScript(t, mode, "env"), "\n") {
		if v, ok := strings.CutPrefix(line, "export BATON_REPLICA_POSTGRES_URL='"); ok {
			url = strings.TrimSuffix(v, "'")
		}
		if v, ok := strings.CutPrefix(line, "export BATON_REPLICA_SCRIPT_ENV='"); ok {
			scriptEnv = strings.Fields(strings.TrimSuffix(v, "'"))
		}
	}
	if url == "" || len(scriptEnv) == 0 {
		t.Fatal("postgres-replica.sh env printed no BATON_REPLICA_POSTGRES_URL or BATON_REPLICA_SCRIPT_ENV")
	}
	return url, scriptEnv
}

// TestChaosDBFailover fails the workers' PostgreSQL over twice (BATON_CHAOS_FAULTS times in a
// soak) under synchronous replication:
// each time the primary is SIGKILLed mid-run, its standby promoted, the workers reconnect
// through the multi-host URL, and the old primary is rebuilt as the new standby. Nothing
// acknowledged may be lost: every invariant holds and the backlog is applied.
func TestChaosDBFailover(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	url, scriptEnv := replica(t, "sync")
	ctx := testenv.Context(t, 5*time.Minute)
	var progress bytes.Buffer
	logDir := t.TempDir()
	if d := os.Getenv("BATON_CHAOS_LOGS"); d != "" {
		logDir = d // kept after the run, to read a failure's worker logs
	}
	cfg := chaos.Config{
		Mode: chaos.Fenced, Workers: 3, Partitions: 6, LogDir: logDir,
		Workload: chaos.Workload{Keys: 60, PerKey: 12, CommandEvery: 4}, Rate: 300,
		Faults: []chaos.FaultKind{chaos.FaultDBFailover}, NumFaults: soak(t, 2), Seed: 7,
		Brokers: brokers, Binary: binary(t), DeployDir: deployDir(t), ScriptEnv: scriptEnv,
		Progress: &progress, Settle: time.Minute,
		Audit: time.Second, // baton audit beside the run, on the same multi-host URL
	}
	res, _, cleanup, err := chaos.RunPostgres(ctx, cfg, url)
	if cleanup != nil {
		defer cleanup()
	}
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatalf("chaos run: %v", err)
	}
	var verdict bytes.Buffer
	chaos.WriteVerdict(&verdict, res)
	t.Logf("verdict:\n%s", verdict.String())
	if !res.OK() {
		t.Errorf("invariants violated across a synchronous failover: %v (settled %v)", res.Verdict.Violations(), res.Settled)
	}
	n := 0
	for _, f := range res.Faults {
		if f.Kind != chaos.FaultDBFailover {
			continue
		}
		n++
		if !f.Bit {
			t.Errorf("failover of %s not proven: %s", f.Target, f.Detail)
		}
	}
	if a := res.Audit; len(a.Violations) != 0 || a.Partitions == 0 {
		t.Errorf("baton audit across the failovers: %d violations (want 0: %v), %d fences judged (want some)", len(a.Violations), a.Violations, a.Partitions)
	}
	if n != cfg.NumFaults {
		t.Errorf("%d failovers injected, want %d", n, cfg.NumFaults)
	}
}

// TestAsyncFailoverLoss shows, deterministically, what a failover under asynchronous
// replication loses and which of Baton's guarantees that breaks. The standby is stopped (a
// standby that lags), writes are acknowledged on the primary, the primary is SIGKILLed and the
// standby, which never received them, promoted. Every Baton write is one transaction (fence,
// effects, outbox rows, admissions), so the promoted database is consistent with itself at an
// earlier point; what breaks is everything that left it after the acknowledgement:
//
//   - a takeover's claim is lost: the superseded owner's token is current again, and that
//     zombie's batch, refused on the old primary, is admitted (a zombie writes);
//   - an advance is lost but not the claim: the owner's next batch is admitted across the gap,
//     so the records of the lost batch are never applied (the fence has no gap check: Kafka
//     offsets have gaps of their own);
//   - a relayed outbox row is lost: the message is in Kafka, and the next append reuses its
//     sequence and derived idempotency key for another row (the zombie's); a receiver whose
//     inbox did not fail over drops that row as stale, and so holds a version of the batch
//     the source database no longer has;
//   - an inbox admission is lost: the redelivered record is admitted again (an effect outside
//     the database, made once per admission, is made twice).
func TestAsyncFailoverLoss(t *testing.T) {
	url, _ := replica(t, "async")
	ctx := testenv.Context(t, 2*time.Minute)
	pool, store, box := failoverStores(t, ctx, url)
	defer pool.Close()
	schema := pool.Config().ConnConfig.RuntimeParams["search_path"]

	t1, t2 := fence.Token{Epoch: 1}, fence.Token{Epoch: 2}
	kTake := fence.Key{Group: "g", Topic: "src", Partition: 0}    // taken over from a by b
	kAdvance := fence.Key{Group: "g", Topic: "src", Partition: 1} // b's advance alone is lost
	const scope, entity = "inbox|g/src/0|dst/0", failoverEntity
	apply := func(k fence.Key, tok fence.Token, first, last int64, msg string) error {
		return applyBatch(ctx, store, box, k, tok, first, last, msg)
	}
	// admit admits (tok, seq) for the entity in the receiver's inbox and, if admitted, applies
	// its effect, in one transaction.
	admit := func(tok fence.Token, seq int64) fence.Verdict {
		var v fence.Verdict
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			if v, err = store.Admit(ctx, tx, scope, entity, tok, seq); err != nil || v != fence.Admitted {
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO effects VALUES ($1, 1) ON CONFLICT (k) DO UPDATE SET n = effects.n + 1`, entity)
			return err
		})
		if err != nil {
			t.Fatalf("admit %s/%d: %v", tok, seq, err)
		}
		return v
	}
	effect := func(k string) int64 {
		var n int64
		if err := pool.QueryRow(ctx, `SELECT coalesce((SELECT n FROM effects WHERE k = $1), 0)`, k).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	// The receiver of partition 0's messages keeps its inbox in a database that does not fail
	// over (here in memory); receive admits a relayed row there.
	remote, err := memfence.New()
	must("receiver's store", err)
	receive := func(r outbox.Row) fence.Verdict {
		t.Helper()
		tx, err := remote.Begin(ctx)
		must("receiver begins", err)
		v, err := remote.Admit(ctx, tx, "receiver|"+r.Source.String()+"|dst/0", failoverEntity, r.Token, r.Seq)
		must("receiver admits", err)
		must("receiver commits", tx.Commit())
		return v
	}
	relay := func(k fence.Key, tok fence.Token) []outbox.Row {
		t.Helper()
		rows, err := box.Pending(ctx, k, tok, 10)
		must("relay reads", err)
		for _, r := range rows {
			if v := receive(r); v != fence.Admitted {
				t.Fatalf("the receiver's inbox: %s for seq %d under %s, want Admitted", v, r.Seq, r.Token)
			}
		}
		if len(rows) > 0 {
			_, err = box.MarkDelivered(ctx, k, tok, rows[len(rows)-1].Seq)
			must("relay marks delivered", err)
		}
		return rows
	}

	// Replicated: a owns partition 0, b partition 1; one message relayed, one admission.
	_, err = store.Claim(ctx, kTake, t1, "a")
	must("a claims 0", err)
	must("a applies 0..9", apply(kTake, t1, 0, 9, "a:1"))
	relay(kTake, t1)
	_, err = store.Claim(ctx, kAdvance, t2, "b")
	must("b claims 1", err)
	must("b applies 1: 0..9", apply(kAdvance, t2, 0, 9, ""))
	if v := admit(t1, 1); v != fence.Admitted {
		t.Fatalf("first admission: %s", v)
	}
	waitReplayed(t, ctx, url)

	// The standby stops receiving; the primary goes on alone and acknowledges.
	replicaScript(t, "async", "standby", "stop")
	_, err = store.Claim(ctx, kTake, t2, "b")
	must("b takes 0 over", err)
	var stale *fence.StaleError
	if err := apply(kTake, t1, 10, 19, "a:2"); !errors.As(err, &stale) {
		t.Fatalf("the zombie a's batch on the primary: %v, want a *fence.StaleError", err)
	}
	must("b applies 0: 10..19", apply(kTake, t2, 10, 19, "b:2"))
	rows := relay(kTake, t2) // published to Kafka, admitted by the receiver, acknowledged
	if len(rows) != 1 || rows[0].Seq != 2 {
		t.Fatalf("relayed %+v, want b's seq 2", rows)
	}
	relayed := rows[0]
	must("b applies 1: 10..19", apply(kAdvance, t2, 10, 19, ""))
	if v := admit(t2, 2); v != fence.Admitted {
		t.Fatalf("second admission: %s", v)
	}
	if v := admit(t2, 2); v != fence.Duplicate {
		t.Fatalf("the redelivered record on the primary: %s, want Duplicate", v)
	}

	// baton audit beside it (with a broker to ask), a pass before the failover.
	var auditor *audit.Auditor
	if brokers := os.Getenv("BATON_KAFKA_BROKERS"); brokers != "" {
		auditor, err = audit.New(audit.Config{Brokers: strings.Split(brokers, ","), Store: url + "&search_path=" + schema,
			Group: "g", Timeout: 5 * time.Second, Logger: slog.New(slog.DiscardHandler), Meter: noop.NewMeterProvider()})
		must("auditor", err)
		defer auditor.Close()
		auditPass(t, ctx, auditor)
	}

	// The primary crashes; the standby, which has none of that, is promoted.
	out := replicaScript(t, "async", "failover")
	t.Logf("failover: %s", strings.TrimSpace(lastLineOf(out)))
	pool.Reset() // the connections to the dead primary; new ones find the promoted node

	// 0. The auditor sees the rewind: the stored token went back, and the admission.
	if auditor != nil {
		found := map[audit.Check]int{}
		for _, v := range auditPass(t, ctx, auditor).Violations {
			found[v.Check]++
			t.Logf("baton audit: %s %s/%d: %s %v", v.Check, v.Topic, v.Partition, v.What, v.Evidence)
		}
		if found[audit.Tokens] == 0 || found[audit.Inbox] == 0 {
			t.Errorf("baton audit after the failover: %v, want the token that went back (tokens) and the admission (inbox)", found)
		}
	}

	// 1. The takeover is gone: a's token is current again and the zombie's batch is admitted.
	st, err := store.Load(ctx, kTake)
	must("load 0", err)
	if st.Token != t1 || st.Position != 9 {
		t.Fatalf("partition 0 after the failover: %s at %d, want the lost takeover's predecessor %s at 9", st.Token, st.Position, t1)
	}
	if err := apply(kTake, t1, 10, 19, "a:2"); err != nil {
		t.Fatalf("the zombie a's batch after the failover: %v; expected it admitted (the loss this test shows)", err)
	}
	t.Logf("partition 0: b's claim (%s) and batch 10..19 lost; the zombie a (%s) wrote 10..19 on the promoted node", t2, t1)

	// 2. The outbox's sequence 2 was relayed, then lost: a's row now has it, and its key.
	rows, err = box.Pending(ctx, kTake, t1, 10)
	must("relay reads after the failover", err)
	if len(rows) != 1 || rows[0].Seq != relayed.Seq || rows[0].IdempotencyKey != relayed.IdempotencyKey || string(rows[0].Value) == string(relayed.Value) {
		t.Fatalf("pending after the failover %+v, want another row under the relayed seq %d and key %q", rows, relayed.Seq, relayed.IdempotencyKey)
	}
	t.Logf("outbox: seq %d (key %q) was published as %q under %s, and is now %q under %s",
		relayed.Seq, relayed.IdempotencyKey, relayed.Value, relayed.Token, rows[0].Value, rows[0].Token)
	// The receiver's inbox drops the zombie's row as stale; b, back, finds its batch applied by
	// the zombie and goes on: the receiver holds b's version of 10..19, the source a's.
	if v := receive(rows[0]); v != fence.Stale {
		t.Fatalf("the receiver's inbox on the zombie's row: %s, want Stale", v)
	}
	_, err = box.MarkDelivered(ctx, kTake, t1, rows[0].Seq)
	must("relay marks the zombie's row delivered", err)
	_, err = store.Claim(ctx, kTake, t2, "b")
	must("b claims 0 again", err)
	if err := apply(kTake, t2, 10, 19, "b:2"); !errors.Is(err, fence.ErrDuplicate) {
		t.Fatalf("b's batch 10..19 again: %v, want fence.ErrDuplicate (the zombie applied it)", err)
	}
	must("b applies 0: 20..29", apply(kTake, t2, 20, 29, "b:3"))
	if rows := relay(kTake, t2); len(rows) != 1 || rows[0].Seq != 3 {
		t.Fatalf("relayed %+v, want b's seq 3", rows)
	}
	t.Logf("receiver: %q dropped as stale; it has b's version of 10..19 (%q), the source database a's (%q)", "a:2", relayed.Value, "a:2")

	// 3. b's advance of partition 1 is gone, its claim is not: b's next batch skips 10..19.
	st, err = store.Load(ctx, kAdvance)
	must("load 1", err)
	if st.Token != t2 || st.Position != 9 {
		t.Fatalf("partition 1 after the failover: %s at %d, want %s at 9", st.Token, st.Position, t2)
	}
	if err := apply(kAdvance, t2, 20, 29, ""); err != nil {
		t.Fatalf("b's next batch 20..29: %v; expected it admitted across the gap", err)
	}
	if got := effect(kAdvance.String()); got != 20 {
		t.Fatalf("partition 1 applied %d records, want 20 (0..9 and 20..29: 10..19 lost)", got)
	}
	t.Logf("partition 1: batch 10..19 lost, 20..29 admitted after position 9: 10 records never applied")

	// 4. The admission is gone: the redelivered record is admitted again.
	if v := admit(t2, 2); v != fence.Admitted {
		t.Fatalf("the redelivered record after the failover: %s, want Admitted (the loss this test shows)", v)
	}
	t.Logf("inbox: (%s, seq 2) of %s admitted twice, once on each side of the failover", t2, entity)
}

// TestSyncFailoverWindow shows the window synchronous replication leaves. With the standby
// stopped, a batch's commit waits for it; cancelled (the caller's context ends), the commit is
// not acknowledged (pgfence.ErrCommitUnknown) but is committed on the primary, where the relay
// reads its outbox row as pending, and so would publish it. The standby, which never received
// it, is promoted: nothing acknowledged is lost (position and outbox as the last acknowledged
// commit left them), but the row the relay could read is gone and its sequence will be reused.
func TestSyncFailoverWindow(t *testing.T) {
	url, _ := replica(t, "sync")
	ctx := testenv.Context(t, 2*time.Minute)
	pool, store, box := failoverStores(t, ctx, url)
	defer pool.Close()
	k, tok := fence.Key{Group: "g", Topic: "src", Partition: 0}, fence.Token{Epoch: 1}
	if _, err := store.Claim(ctx, k, tok, "a"); err != nil {
		t.Fatal(err)
	}
	if err := applyBatch(ctx, store, box, k, tok, 0, 9, "a:1"); err != nil {
		t.Fatal(err)
	}

	replicaScript(t, "sync", "standby", "stop")
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	err := applyBatch(wctx, store, box, k, tok, 10, 19, "a:2")
	cancel()
	if !errors.Is(err, pgfence.ErrCommitUnknown) {
		t.Fatalf("a commit waiting for a stopped synchronous standby, cancelled: %v, want pgfence.ErrCommitUnknown (never acknowledged)", err)
	}
	// pgx closes the cancelled connection and sends the server its cancel request from
	// another goroutine; the backend ends its wait for the standby, and its commit becomes
	// visible, when that request arrives: wait for it (pgx gives the request 15 s).
	var st fence.State
	cancelled := time.Now()
	for deadline := cancelled.Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if st, err = store.Load(ctx, k); err != nil {
			t.Fatal(err)
		}
		if st.Position == 19 || time.Now().After(deadline) {
			break
		}
	}
	rows, err := box.Pending(ctx, k, tok, 10)
	if err != nil {
		t.Fatal(err)
	}
	if st.Position != 19 || len(rows) != 2 || rows[1].Seq != 2 {
		t.Fatalf("on the primary after the cancelled wait: position %d, pending %+v; want the unacknowledged batch visible (position 19, seq 2 pending)", st.Position, rows)
	}
	t.Logf("primary: the unacknowledged batch is visible (%v after the cancel): position %d, outbox seq %d %q pending for the relay",
		time.Since(cancelled).Round(time.Millisecond), st.Position, rows[1].Seq, rows[1].Value)

	out := replicaScript(t, "sync", "failover")
	t.Logf("failover: %s", lastLineOf(out))
	pool.Reset()
	if st, err = store.Load(ctx, k); err != nil {
		t.Fatal(err)
	}
	if rows, err = box.Pending(ctx, k, tok, 10); err != nil {
		t.Fatal(err)
	}
	if st.Position != 9 || len(rows) != 1 || rows[0].Seq != 1 {
		t.Fatalf("on the promoted node: position %d, pending %+v; want the last acknowledged state (position 9, seq 1 pending)", st.Position, rows)
	}
	t.Logf("promoted: position %d, outbox seq 1 pending: the unacknowledged batch is gone, and seq 2 with it", st.Position)
}

// auditPass makes passes until one reads every source (the first after a failover may meet
// a dead connection), and returns it.
func auditPass(t *testing.T, ctx context.Context, a *audit.Auditor) *audit.Report {
	t.Helper()
	for i := 0; ; i++ {
		r, err := a.Pass(ctx)
		if err == nil {
			return r
		}
		if i == 10 {
			t.Fatalf("baton audit: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// failoverStores makes a schema with the fence, outbox and effects tables at url and returns
// a pool on it (closed by the caller) and the stores.
func failoverStores(t *testing.T, ctx context.Context, url string) (*pgxpool.Pool, *pgfence.Store, *pgoutbox.Store) {
	t.Helper()
	schema := fmt.Sprintf("failover_%d", time.Now().UnixNano())
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema+"; CREATE TABLE "+schema+".effects (k text PRIMARY KEY, n bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	admin.Close(ctx)
	pool, err := pgxpool.New(ctx, url+"&search_path="+schema)
	if err != nil {
		t.Fatal(err)
	}
	store, err := pgfence.New(pool)
	if err == nil {
		err = store.Migrate(ctx)
	}
	var box *pgoutbox.Store
	if err == nil {
		box, err = pgoutbox.New(pool, store)
	}
	if err == nil {
		err = box.Migrate(ctx)
	}
	if err != nil {
		pool.Close()
		t.Fatal(err)
	}
	return pool, store, box
}

// failoverEntity is the record key of the messages the failover tests append and admit.
const failoverEntity = "order-1"

// applyBatch writes a batch of partition k under tok: the effect (one per record) and, if msg
// is set, an outbox row, in one transaction with the fence.
func applyBatch(ctx context.Context, store *pgfence.Store, box *pgoutbox.Store, k fence.Key, tok fence.Token, first, last int64, msg string) error {
	return store.Apply(ctx, k, tok, first, last, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET n = effects.n + $2`, k.String(), last-first+1); err != nil {
			return err
		}
		if msg == "" {
			return nil
		}
		return box.Append(ctx, tx, k, tok, outbox.Message{Topic: "dst", Key: []byte(failoverEntity), Value: []byte(msg)})
	})
}

// waitReplayed waits until every node of url in recovery has replayed the primary's WAL.
func waitReplayed(t *testing.T, ctx context.Context, url string) {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	lsn := func(c *pgx.ConnConfig, q string) string {
		conn, err := pgx.ConnectConfig(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var s string
		if err := conn.QueryRow(ctx, q).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	primary := cfg.Copy()
	want := lsn(primary, `SELECT pg_current_wal_lsn()::text`)
	standby := cfg.Copy()
	standby.Host, standby.Port, standby.Fallbacks, standby.ValidateConnect = cfg.Fallbacks[0].Host, cfg.Fallbacks[0].Port, nil, nil
	for deadline := time.Now().Add(30 * time.Second); ; {
		caught := lsn(standby, `SELECT (pg_last_wal_replay_lsn() >= '`+want+`'::pg_lsn)::text`)
		if caught == "true" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the standby did not replay up to %s", want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func lastLineOf(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
