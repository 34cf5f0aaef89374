package chaos

import (
	"context"
	"database/sql"
	"path/filepath"
	"slices"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
)

func topicCheckDB(t *testing.T) DB {
	t.Helper()
	sdb, err := sql.Open("sqlite", "file://"+filepath.Join(t.TempDir(), "chaos.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sdb.Close() })
	db := SQLDB(sdb)
	if err := Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	return db
}

func applied(t *testing.T, db DB, part int32, first, last, era, epoch int64, worker string, at int64) {
	t.Helper()
	if err := db.Exec(context.Background(), `INSERT INTO chaos_applied (topic, part, first_off, last_off, era, epoch, worker, at_ms) VALUES ('t', $1, $2, $3, $4, $5, $6, $7)`,
		part, first, last, era, epoch, worker, at); err != nil {
		t.Fatal(err)
	}
}

// A recreated topic's offsets start again at 0 in the era its reset moved the fence to: the
// checker looks for re-applied offsets within one incarnation (chaos_incarnations), keeps
// comparing tokens across incarnations, and counts what was applied while the topic was held.
func TestCheckAcrossIncarnations(t *testing.T) {
	ctx := context.Background()
	db := topicCheckDB(t)
	applied(t, db, 0, 0, 99, 1, 3, "w1", 1000)
	applied(t, db, 0, 100, 199, 1, 3, "w1", 2000)
	applied(t, db, 0, 0, 49, 2, 0, "w2", 5000) // the new incarnation, after the reset
	check := func() Verdict {
		t.Helper()
		v := Verdict{Attempts: map[string]int64{}}
		if err := checkLog(ctx, db, &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := check(); v.OverlapBatches != 1 {
		t.Fatalf("without the incarnation recorded: %d re-applied batches, want 1 (offsets 0..49 again)", v.OverlapBatches)
	}
	if err := db.Exec(ctx, `INSERT INTO chaos_incarnations (topic, part, era) VALUES ('t', 0, 2)`); err != nil {
		t.Fatal(err)
	}
	if v := check(); v.OverlapBatches != 0 || v.StaleCommits != 0 || v.HeldApplied != 0 {
		t.Fatalf("new incarnation from offset 0: %+v", v)
	}
	// Within an incarnation re-applied offsets still count; across them tokens still rise.
	applied(t, db, 0, 40, 60, 2, 1, "w3", 6000)
	applied(t, db, 0, 200, 210, 1, 3, "w1", 7000) // the old incarnation's zombie
	v := check()
	if v.OverlapBatches != 1 || v.StaleCommits != 1 {
		t.Fatalf("re-applied %d (want 1), stale %d (want 1)", v.OverlapBatches, v.StaleCommits)
	}

	// Held: nothing of the topic applied between its change and its release.
	if err := db.Exec(ctx, `INSERT INTO chaos_topic_changes (topic, kind, changed_ms, released_ms) VALUES ('t', 'topic-recreate', 2500, 4000)`); err != nil {
		t.Fatal(err)
	}
	if v := check(); v.HeldApplied != 0 {
		t.Fatalf("held applied %d, want 0", v.HeldApplied)
	}
	applied(t, db, 1, 0, 5, 1, 3, "w2", 3000)
	if v := check(); v.HeldApplied != 1 || v.OK() {
		t.Fatalf("held applied %d (want 1), ok %v: %v", v.HeldApplied, v.OK(), v.Violations())
	}
}

// caughtUp counts the current incarnation only: the old one's higher offsets do not make a
// new incarnation's backlog look applied.
func TestCaughtUpCurrentIncarnation(t *testing.T) {
	ctx := context.Background()
	db := topicCheckDB(t)
	h := &harness{db: db}
	applied(t, db, 0, 0, 199, 1, 3, "w1", 1000)
	applied(t, db, 0, 0, 49, 2, 0, "w2", 5000)
	if err := db.Exec(ctx, `INSERT INTO chaos_incarnations (topic, part, era) VALUES ('t', 0, 2)`); err != nil {
		t.Fatal(err)
	}
	ends := func(o int64) kadm.ListedOffsets {
		return kadm.ListedOffsets{"t": {0: {Topic: "t", Partition: 0, Offset: o}}}
	}
	if !h.caughtUp(ctx, ends(50)) {
		t.Error("offsets 0..49 of the new incarnation applied, end 50: not caught up")
	}
	if h.caughtUp(ctx, ends(60)) {
		t.Error("end 60, the new incarnation applied to 49: caught up")
	}
}

// The baselines skip the topic faults; a baseline given only topic faults is refused.
func TestTopicFaultsFencedOnly(t *testing.T) {
	base := Config{Brokers: []string{"127.0.0.1:1"}, SQLitePath: "x.db", Binary: "x", Workload: Workload{Keys: 1, PerKey: 1}}
	c := base
	c.Mode, c.Faults = Unfenced, []FaultKind{FaultKill, FaultTopicRecreate, FaultTerm, FaultTopicGrow}
	if err := c.defaults(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Faults, []FaultKind{FaultKill, FaultTerm}) || c.NumFaults != 6 {
		t.Errorf("unfenced faults %v (%d)", c.Faults, c.NumFaults)
	}
	c = base
	c.Mode, c.Faults = Lock, TopicFaults
	if err := c.defaults(); err == nil {
		t.Error("a lock baseline of topic faults only was accepted")
	}
	c = base
	c.Faults = TopicFaults
	if err := c.defaults(); err != nil || len(c.Faults) != 2 {
		t.Errorf("fenced: %v %v", c.Faults, err)
	}
}

// The workers' sink wrapper keeps the store's fence.Topics: the consumer finds topic
// identities only on the sink it is given.
func TestAttemptSinkKeepsTopics(t *testing.T) {
	db := topicCheckDB(t)
	store, err := sqlitefence.Open(filepath.Join(t.TempDir(), "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	s := withTopics(&attemptSink[*sql.Tx]{Sink: store, db: db}, fence.Sink[*sql.Tx](store))
	if _, ok := s.(fence.Topics); !ok {
		t.Fatal("the wrapped sink hides fence.Topics: workers would never see a recreated or grown topic")
	}
}

// A resumed worker's commit counts as a zombie's after its takeover only if another worker had
// committed on the partition at its token or a later one: tokens compare as (era, epoch), so
// an earlier era's higher epoch (before a group was recreated, a topic reset) is no takeover.
func TestZombieOverTakenComparesEras(t *testing.T) {
	ctx := context.Background()
	db := topicCheckDB(t)
	attempt := func(worker string, era, epoch, at int64) {
		t.Helper()
		if err := db.Exec(ctx, `INSERT INTO chaos_attempts (worker, topic, part, era, epoch, first_off, last_off, outcome, zombie, resumed, detail, at_ms) VALUES ($1, 't', 0, $2, $3, 0, 0, $4, false, true, '', $5)`,
			worker, era, epoch, OutcomeCommitted, at); err != nil {
			t.Fatal(err)
		}
	}
	check := func() int64 {
		t.Helper()
		v := Verdict{Attempts: map[string]int64{}}
		if err := checkLog(ctx, db, &v); err != nil {
			t.Fatal(err)
		}
		return v.ZombieOverTaken
	}
	applied(t, db, 0, 0, 9, 3, 90, "w1", 1000) // era 3, epoch 90
	attempt("w2", 5, 62, 2000)                 // a later era: no takeover, whatever the epochs
	if n := check(); n != 0 {
		t.Fatalf("%d zombie writes after their takeover, want 0: 3.90 is below 5.62", n)
	}
	applied(t, db, 0, 10, 19, 5, 63, "w3", 3000) // taken over at 5.63
	attempt("w2", 5, 62, 4000)                   // and w2 writes at 5.62 after it
	if n := check(); n != 1 {
		t.Fatalf("%d zombie writes after their takeover, want 1 (5.63 committed before w2's 5.62)", n)
	}
}
