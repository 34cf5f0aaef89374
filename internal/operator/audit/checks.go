package audit

import (
	"fmt"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/operator/status"
)

// The judgements, each a function of what was read: the pass feeds them, the tests and the
// mutants aim at them.

// judgeLog is the Skipped check of one partition: its sink position pos (read after kv) against
// the log start and the committed offset in kv, and the position observed in the previous pass
// (prev, nil at the first) against the high watermark read after it.
func judgeLog(k fence.Key, tok fence.Token, pos int64, prev *partState, kv *status.KafkaState, now time.Time) []Violation {
	var out []Violation
	if pos != fence.NoPosition {
		if start, ok := kv.LogStart[k]; ok && start > pos+1 {
			out = append(out, violation(Skipped, k, now, fmt.Sprint(pos), "records deleted before they were applied (data loss)",
				f("position", pos), f("log_start", start), f("lost", start-(pos+1))))
		}
		// A token that changed since the last pass may be a new owner reading a recreated
		// topic after its reset: the committed offset still counts the old incarnation's
		// records until that owner's first commit, so it gets one interval to make it.
		if c, ok := kv.Committed[k]; ok && c > pos+1 && (prev == nil || prev.tok == tok) {
			out = append(out, violation(Skipped, k, now, fmt.Sprint(c), "committed offset ahead of the sink's position",
				f("committed", c), f("position", pos), f("skipped", c-(pos+1))))
		}
	}
	// The previous position was read before this high watermark: within one incarnation (the
	// token unchanged) it lies below it.
	if prev != nil && prev.tok == tok && prev.pos != fence.NoPosition {
		if hwm, ok := kv.HighWatermark[k]; ok && prev.pos >= hwm {
			out = append(out, violation(Skipped, k, now, fmt.Sprint(prev.pos), "sink position past the end of the log",
				f("position", prev.pos), f("high_watermark", hwm)))
		}
	}
	return out
}

// judgeToken is the Tokens check of one fence: its stored token against the previous
// observation and the partition's recorded recoveries (oldest first): recs read before the
// fence, eras read after it whenever recs lacked the fence's era.
func judgeToken(k fence.Key, tok fence.Token, prev *partState, recs, eras []fence.Recovery, now time.Time) []Violation {
	var out []Violation
	if prev != nil && tok.Compare(prev.tok) < 0 {
		out = append(out, violation(Tokens, k, now, prev.tok.String()+">"+tok.String(), "stored token went back",
			f("previous", prev.tok.String()), f("stored", tok.String())))
	}
	var top fence.Token
	var last *fence.Recovery
	for i := range recs {
		if top.Compare(recs[i].To) < 0 {
			top, last = recs[i].To, &recs[i]
		}
	}
	eraRecorded := eraIn(tok, eras)
	if last != nil && tok.Compare(top) < 0 {
		out = append(out, violation(Tokens, k, now, tok.String()+"<"+top.String(), "stored token below a recorded recovery",
			f("stored", tok.String()), f("recovered_to", top.String()), f("recovery_reason", last.Reason), f("recovered_at", last.At)))
	}
	if !eraRecorded {
		out = append(out, violation(Tokens, k, now, tok.String(), "era with no recorded recovery",
			f("stored", tok.String()), f("recoveries", len(eras))))
	}
	return out
}

// judgeStall is the Liveness check of a partition with a lag: its position has not moved
// since since, when the high watermark was sinceHWM. A lag of one record that was there
// already then is no stall: a transactional producer's last commit marker is an offset no
// record is applied at.
func judgeStall(k fence.Key, pos, hwm int64, since time.Time, sinceHWM int64, now time.Time, bound time.Duration) (Violation, bool) {
	if now.Sub(since) <= bound {
		return Violation{}, false
	}
	if hwm-(pos+1) <= 1 && hwm <= sinceHWM {
		return Violation{}, false
	}
	return violation(Liveness, k, now, fmt.Sprint(pos), "a lagging partition's position has not moved",
		f("position", pos), f("high_watermark", hwm), f("lag", hwm-(pos+1)), f("since", since.UTC()), f("bound", bound.String())), true
}

// judgeOutbox is the Outbox check of one cursor and its pending rows: as many rows as sequences
// allocated above the cursor (gap reports a shortfall, whose first missing sequence the caller
// looks up), none above the last allocated one, and the oldest younger than age.
func judgeOutbox(k fence.Key, c status.OutboxCursor, now time.Time, age time.Duration) (out []Violation, gap bool) {
	want := c.LastSeq - c.Delivered
	if c.Pending < want {
		gap = true
	}
	if c.MaxSeq > c.LastSeq {
		out = append(out, violation(Outbox, k, now, fmt.Sprint(c.MaxSeq), "outbox row above the last allocated sequence",
			f("seq", c.MaxSeq), f("last_seq", c.LastSeq)))
	}
	if c.Pending > 0 && now.Sub(c.Oldest) > age {
		out = append(out, violation(Outbox, k, now, fmt.Sprint(c.MinSeq), "oldest pending outbox row older than the bound",
			f("seq", c.MinSeq), f("created", c.Oldest), f("age", now.Sub(c.Oldest).Round(time.Second).String()), f("bound", age.String()),
			f("delivered_seq", c.Delivered), f("pending", c.Pending)))
	}
	return out, gap
}

// firstMissing returns the first sequence above after that seqs (ascending, read from after
// on) does not hold, if one lies within them.
func firstMissing(after int64, seqs []int64) (int64, bool) {
	next := after + 1
	for _, s := range seqs {
		if s != next {
			return next, true
		}
		next++
	}
	return 0, false
}

// judgeAdmission is the Inbox check of one entity: its admission now against the previous
// observation.
func judgeAdmission(group string, prev, cur status.Admission, now time.Time) (Violation, bool) {
	back := cur.Token.Compare(prev.Token) < 0 || cur.Token == prev.Token && cur.Seq < prev.Seq
	if !back {
		return Violation{}, false
	}
	return Violation{Check: Inbox, Group: group, Partition: -1, What: "inbox admission went back", At: now.UTC(),
		Evidence: []Field{f("scope", cur.Scope), f("id", cur.ID), f("previous", fmt.Sprintf("%s#%d", prev.Token, prev.Seq)), f("stored", fmt.Sprintf("%s#%d", cur.Token, cur.Seq))},
		id:       fmt.Sprintf("inbox/%s/%s/%s#%d>%s#%d", cur.Scope, cur.ID, prev.Token, prev.Seq, cur.Token, cur.Seq)}, true
}
