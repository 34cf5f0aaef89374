package audit_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/operator/audit"
)

var tok5 = fence.Token{Epoch: 5}

// Records deleted by retention before they were applied: the log start passes the sink's
// position, and the loss is counted.
func TestSkippedRecordsDeletedBeforeApplied(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		e.produce(t, 10)
		e.claim(t, tok5)
		e.apply(t, tok5, 0, 2)
		a, _ := e.auditor(t)
		clean(t, a, "applied 0..2 of 10")
		// Retention (DeleteRecords) deletes 0..5: 3, 4 and 5 were never applied.
		resp, err := e.adm.DeleteRecords(context.Background(), kadm.Offsets{e.src: {0: kadm.Offset{Topic: e.src, Partition: 0, At: 6}}})
		if err == nil {
			err = resp.Error()
		}
		if err != nil {
			t.Fatalf("delete records: %v", err)
		}
		ev := within(t, e, a, audit.Skipped, "records deleted before they were applied")
		is(t, ev, "position", 2)
		is(t, ev, "log_start", 6)
		is(t, ev, "lost", 3)
	})
}

// A group seeked past records: Kafka's committed offset runs ahead of the sink's position.
func TestSkippedCommittedAheadOfPosition(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		e.produce(t, 10)
		e.claim(t, tok5)
		e.apply(t, tok5, 0, 2)
		commit(t, e, 3)
		a, _ := e.auditor(t)
		clean(t, a, "committed at position+1")
		commit(t, e, 8)
		ev := within(t, e, a, audit.Skipped, "committed offset ahead")
		is(t, ev, "committed", 8)
		is(t, ev, "position", 2)
		is(t, ev, "skipped", 5)
	})
}

func commit(t *testing.T, e *env, at int64) {
	t.Helper()
	var o kadm.Offsets
	o.Add(kadm.Offset{Topic: e.src, Partition: 0, At: at, LeaderEpoch: -1})
	resp, err := e.adm.CommitOffsets(context.Background(), e.group, o)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatalf("commit %d: %v", at, err)
	}
}

// A fence moved back by hand (a restore of the fence table): the stored token decreases between
// two observations; an era raised by hand has no recorded recovery.
func TestTokensMovedBackByHand(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		e.produce(t, 3)
		e.claim(t, tok5)
		e.apply(t, tok5, 0, 2)
		a, _ := e.auditor(t)
		clean(t, a, "one claim")
		e.exec(t, `UPDATE baton_fences SET epoch = 3 WHERE `+e.grp+` = $1`, e.group)
		ev := within(t, e, a, audit.Tokens, "stored token went back")
		is(t, ev, "previous", "0.5")
		is(t, ev, "stored", "0.3")

		e.exec(t, `UPDATE baton_fences SET era = 1 WHERE `+e.grp+` = $1`, e.group)
		ev = within(t, e, a, audit.Tokens, "era with no recorded recovery")
		is(t, ev, "stored", "1.3")
	})
}

// An outbox row deleted by hand leaves a gap above the cursor; a row left pending past the bound
// is reported with its age.
func TestOutboxRowDeleted(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		e.produce(t, 3)
		e.claim(t, tok5)
		e.apply(t, tok5, 0, 0, e.msgs(4)...)
		a, clk := e.auditor(t)
		clean(t, a, "four rows pending")
		e.exec(t, `DELETE FROM baton_outbox WHERE `+e.grp+` = $1 AND seq = 2`, e.group)
		ev := within(t, e, a, audit.Outbox, "outbox row missing above the cursor")
		is(t, ev, "first_missing_seq", 2)
		is(t, ev, "rows_pending", 3)
		is(t, ev, "rows_allocated", 4)

		clk.t = clk.t.Add(2 * time.Minute)
		ev = within(t, e, a, audit.Outbox, "oldest pending outbox row older than the bound")
		is(t, ev, "seq", 1)
		is(t, ev, "bound", "1m0s")
	})
}

// A cursor moved past rows by hand: the cursor counts them delivered, the output topic has no
// copy of them.
func TestOutboxCursorPastUndeliveredRows(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		e.produce(t, 3)
		e.claim(t, tok5)
		e.apply(t, tok5, 0, 0, e.msgs(2)...)
		a, _ := e.auditor(t)
		clean(t, a, "two rows pending")
		if n := e.flush(t, tok5); n != 2 {
			t.Fatalf("flushed %d rows, want 2", n)
		}
		clean(t, a, "two rows delivered")
		e.apply(t, tok5, 1, 1, e.msgs(3)...)
		e.exec(t, `UPDATE baton_outbox_cursors SET delivered_seq = last_seq WHERE `+e.grp+` = $1`, e.group)
		ev := within(t, e, a, audit.Outbox, "cursor passed a row with no copy")
		is(t, ev, "first_missing_seq", 3)
		is(t, ev, "missing", 3)
		is(t, ev, "delivered_seq", 5)
	})
}

// A forged copy on the output topic with a gap in baton-seq: its sequence was never allocated.
// A re-published copy is counted, not flagged; a first copy under a lower token than an earlier
// sequence's is flagged.
func TestDeliveryForgedCopy(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		e.produce(t, 3)
		e.claim(t, tok5)
		e.apply(t, tok5, 0, 0, e.msgs(3)...)
		a, _ := e.auditor(t)
		clean(t, a, "three rows pending")
		e.flush(t, tok5)
		clean(t, a, "three rows delivered")
		// The relay's at-least-once re-publish of seq 2: counted.
		e.forge(t, tok5, 2)
		if r := clean(t, a, "a re-published copy"); r.Republished != 1 {
			t.Errorf("republished = %d, want 1", r.Republished)
		}
		// seq 6: 4 and 5 were never allocated either (last_seq 3).
		e.forge(t, tok5, 6)
		ev := within(t, e, a, audit.Delivery, "copy of a sequence the outbox never allocated")
		is(t, ev, "seq", 6)
		is(t, ev, "last_seq", 3)

		// A first copy of a later sequence under a lower token than seq 6's.
		e.forge(t, fence.Token{Epoch: 4}, 7)
		ev = within(t, e, a, audit.Delivery, "first copy's token below")
		is(t, ev, "seq", 7)
		is(t, ev, "token", "0.4")
		is(t, ev, "previous_token", "0.5")
	})
}

// forge produces a copy as the relay would (its headers as outbox/doc.go lists them), with the
// given token and sequence.
func (e *env) forge(t *testing.T, tok fence.Token, seq int64) {
	t.Helper()
	r := &kgo.Record{Topic: e.dest, Partition: 0, Key: []byte("forged"), Value: []byte("cmd"), Headers: []kgo.RecordHeader{
		{Key: "baton-token", Value: []byte(tok.String())},
		{Key: "baton-seq", Value: []byte(itoa(seq))},
		{Key: "baton-source", Value: []byte(e.key.String())},
	}}
	if err := e.cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// An inbox admission moved back by hand.
func TestInboxAdmissionMovedBack(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		e.admit(t, "recv/src/0/dest/0", "device-1", tok5, 3)
		a, _ := e.auditor(t)
		clean(t, a, "one admission")
		e.admit(t, "recv/src/0/dest/0", "device-1", tok5, 4)
		clean(t, a, "the admission rose")
		e.exec(t, `UPDATE baton_fences_keyed SET seq = 2 WHERE id = $1`, "device-1")
		ev := within(t, e, a, audit.Inbox, "inbox admission went back")
		is(t, ev, "previous", "0.5#4")
		is(t, ev, "stored", "0.5#2")
	})
}

// A partition whose commits stopped while records arrive: its position stands still past the
// bound with a lag.
func TestLivenessCommitsStopped(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		e.produce(t, 3)
		e.claim(t, tok5)
		e.apply(t, tok5, 0, 2)
		a, clk := e.auditor(t)
		clean(t, a, "caught up")
		e.produce(t, 4)
		clean(t, a, "lagging, within the bound")
		clk.t = clk.t.Add(30 * time.Second)
		clean(t, a, "lagging, within the bound")
		e.apply(t, tok5, 3, 3)
		clk.t = clk.t.Add(45 * time.Second)
		clean(t, a, "moved, lagging within the bound")
		clk.t = clk.t.Add(61 * time.Second)
		ev := within(t, e, a, audit.Liveness, "position has not moved")
		is(t, ev, "position", 3)
		is(t, ev, "high_watermark", 7)
		is(t, ev, "lag", 3)
	})
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// A lag of one record standing still since the auditor first saw it is no stall (a
// transactional producer's last commit marker is an offset nothing is applied at); a record
// produced after it is.
func TestLivenessTrailingOffsetIsNoStall(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		e.produce(t, 4)
		e.claim(t, tok5)
		e.apply(t, tok5, 0, 2)
		a, clk := e.auditor(t)
		clean(t, a, "a lag of one")
		clk.t = clk.t.Add(2 * time.Minute)
		clean(t, a, "a lag of one, standing still past the bound")
		e.produce(t, 1)
		ev := within(t, e, a, audit.Liveness, "position has not moved")
		is(t, ev, "position", 2)
		is(t, ev, "lag", 2)
	})
}

// A recreated topic accepted by a reset: the fence moves to a recorded era with no position, and
// the new owner applies the new incarnation from 0 while Kafka's committed offset still counts
// the old one's records until its first commit. No violation, until that offset is still ahead
// a pass later.
func TestTopicResetIsNoViolation(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		e.produce(t, 10)
		e.claim(t, tok5)
		e.apply(t, tok5, 0, 8)
		commit(t, e, 9)
		old := e.identity(t)
		if _, _, err := e.topics.SeeTopic(ctx, e.group, e.src, old, "first claim"); err != nil {
			t.Fatal(err)
		}
		a, _ := e.auditor(t)
		clean(t, a, "applied 0..8, committed 9")
		next := e.recreate(t, 3)
		commit(t, e, 9) // the old incarnation's, whether or not the brokers dropped it with the topic
		if err := e.topics.ResetTopic(ctx, e.group, e.src, old, next, "recreated by the test"); err != nil {
			t.Fatal(err)
		}
		clean(t, a, "reset: no position")
		tok := fence.Token{Era: 1, Epoch: 6}
		e.claim(t, tok)
		e.apply(t, tok, 0, 0)
		clean(t, a, "the new incarnation's first record applied, the old commit still ahead")
		ev := within(t, e, a, audit.Skipped, "committed offset ahead")
		is(t, ev, "committed", 9)
		is(t, ev, "position", 0)
	})
}
