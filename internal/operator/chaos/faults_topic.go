package chaos

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/operator/status"
)

// The topic faults: the run's source topic recreated or grown mid-run, the harness playing
// the operator of DESIGN.md's procedures (the built-in workload, fenced mode only: other runs
// skip them, see Config.defaults).
const (
	// Pause the producer, wait until everything produced is applied, delete the source topic
	// and create it again with as many partitions; resume producing into the new incarnation;
	// prove every partition held (the consumers' ERROR at their claims, nothing applied), then
	// reset it through baton topics reset's code path and prove the new incarnation applied
	// from offset 0 on every partition.
	FaultTopicRecreate FaultKind = "topic-recreate"
	// Pause the producer, drain, grow the source topic (growTo: 6 -> 9 partitions); resume
	// producing over the new partitions; prove every partition held with records waiting on
	// each and nothing applied, then acknowledge through baton topics ack's code path and
	// prove the new partitions applied.
	FaultTopicGrow FaultKind = "topic-grow"
)

// TopicFaults lists the topic faults. They need the built-in workload in fenced mode.
var TopicFaults = []FaultKind{FaultTopicRecreate, FaultTopicGrow}

func isTopicFault(f FaultKind) bool { return slices.Contains(TopicFaults, f) }

func (r *Result) hasTopicFaults() bool {
	return slices.ContainsFunc(r.Config.Faults, isTopicFault)
}

// The proofs of the topic faults look for records only on the partitions the workload's keys
// are produced to: with a handful of keys a partition (a grown topic's above all) may have
// none, and it never gets a record, a batch or, unless its claim is new, a hold.

// keyedParts returns the partitions of a topic of n partitions that at least one of the
// workload's keys is produced to: the key's murmur2 hash modulo n, as the harness's producer
// (franz-go's default partitioner) and Kafka's own place a keyed record.
func keyedParts(keys int, n int32) map[int32]bool {
	p := kgo.StickyKeyPartitioner(nil).ForTopic("")
	out := map[int32]bool{}
	for k := range keys {
		out[int32(p.Partition(&kgo.Record{Key: []byte(Key(k))}, int(n)))] = true
	}
	return out
}

// growTo is the partition count topic-grow grows a topic of parts partitions to: by half (6
// -> 9), at least one, while the topic has fewer partitions than a quarter of the keys, then by
// one (a long run grows it every few minutes: by half it would soon have thousands), and on
// past partitions no key is produced to, so that the growth has a new partition with records.
func growTo(parts int32, keys int) int32 {
	step := int32(1)
	if int(parts) < keys/4 {
		step = max(1, parts/2)
	}
	want := parts + step
	for i := 0; i < 64; i++ {
		keyed := keyedParts(keys, want)
		for p := parts; p < want; p++ {
			if keyed[p] {
				return want
			}
		}
		want++
	}
	return want
}

// topicLookWait is how long after a growth the harness waits before producing again: the
// consumer's members look at their topics every 5 s (consumer.topicLook), so by then every
// older partition compares again before its next batch.
const topicLookWait = 6 * time.Second

// The consumer's ERROR at a claim it holds (consumer/topic.go, hold): the topic's identity
// differs from the one stored with the fences.
var heldRE = regexp.MustCompile(`msg="topic (recreated|grown): [^"]*partition held[^"]*".* topic=(\S+) partition=(\d+)`)

// logMarks returns the workers' log files' sizes now: held scans what was written after.
func (h *harness) logMarks() map[string]int64 {
	h.mu.Lock()
	logs := slices.Clone(h.logs)
	h.mu.Unlock()
	out := map[string]int64{}
	for _, p := range logs {
		if fi, err := os.Stat(p); err == nil {
			out[p] = fi.Size()
		}
	}
	return out
}

// held returns the partitions of topic whose hold (why: "recreated" or "grown") a worker
// logged since marks.
func (h *harness) held(marks map[string]int64, topic, why string) map[int32]bool {
	h.mu.Lock()
	logs := slices.Clone(h.logs)
	h.mu.Unlock()
	out := map[int32]bool{}
	for _, p := range logs {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		if _, err := f.Seek(marks[p], io.SeekStart); err == nil {
			sc := bufio.NewScanner(f)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				m := heldRE.FindStringSubmatch(sc.Text())
				if m == nil || m[1] != why || m[2] != topic {
					continue
				}
				if n, err := strconv.Atoi(m[3]); err == nil {
					out[int32(n)] = true
				}
			}
		}
		f.Close()
	}
	return out
}

// topicState is the source topic as the brokers describe it.
type topicState struct {
	id     [16]byte
	parts  int32
	ready  bool // every partition has a leader
	exists bool
}

func (t topicState) idText() string { return base64.RawURLEncoding.EncodeToString(t.id[:]) }

func (h *harness) describe(ctx context.Context, topic string) (topicState, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	td, err := h.adm.ListTopics(ctx, topic)
	if err != nil {
		return topicState{}, err
	}
	d, ok := td[topic]
	if !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
		return topicState{}, nil
	}
	if d.Err != nil {
		return topicState{}, d.Err
	}
	st := topicState{id: d.ID, parts: int32(len(d.Partitions)), exists: true, ready: len(d.Partitions) > 0}
	for _, p := range d.Partitions {
		st.ready = st.ready && p.Err == nil && p.Leader >= 0
	}
	return st, nil
}

// awaitTopic polls the topic's description until ok accepts it (at most wait).
func (h *harness) awaitTopic(ctx context.Context, topic string, wait time.Duration, ok func(topicState) bool) (topicState, error) {
	deadline := time.Now().Add(wait)
	for {
		st, err := h.describe(ctx, topic)
		if err == nil && ok(st) {
			return st, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return st, fmt.Errorf("topic %s not as expected within %s (last: exists %v, %d partitions, ready %v, err %v)", topic, wait, st.exists, st.parts, st.ready, err)
		}
		sleep(ctx, 200*time.Millisecond)
	}
}

// drain waits until the applied log reaches the end of every partition of topic.
func (h *harness) drain(ctx context.Context, topic string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		ends, err := h.adm.ListEndOffsets(ctx, topic)
		if err == nil && h.caughtUp(ctx, ends) {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s not applied to its end within %s", topic, wait)
		}
		sleep(ctx, 250*time.Millisecond)
	}
}

// awaitEnds waits until every partition of topic in parts has its end offset above floor's
// (absent: 0): records wait on each.
func (h *harness) awaitEnds(ctx context.Context, topic string, parts map[int32]bool, floor map[int32]int64, wait time.Duration) bool {
	deadline := time.Now().Add(wait)
	for {
		ends, err := h.adm.ListEndOffsets(ctx, topic)
		if err == nil {
			above := map[int32]bool{}
			ends.Each(func(o kadm.ListedOffset) {
				if o.Err == nil && o.Offset > floor[o.Partition] {
					above[o.Partition] = true
				}
			})
			if len(missing(above, parts)) == 0 {
				return true
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		sleep(ctx, 200*time.Millisecond)
	}
}

// appliedSince counts the batches of topic committed at or after ms.
func (h *harness) appliedSince(ctx context.Context, topic string, ms int64) int64 {
	var n int64
	if err := h.db.QueryRow(ctx, `SELECT count(*) FROM chaos_applied WHERE topic = $1 AND at_ms >= $2`, topic, ms).Scan(&n); err != nil {
		return -1
	}
	return n
}

// release resets (growth false) or acknowledges (growth true) the topic through the code path
// of baton topics reset and ack (status.Collector.ResetTopic), with a reason.
func (h *harness) release(ctx context.Context, topic string, growth bool, reason string) (from, to fence.Topic, err error) {
	store := h.cfg.PostgresURL
	if store == "" {
		store = h.cfg.SQLitePath
	}
	c, err := status.NewCollector(status.Config{Brokers: h.cfg.Brokers, Store: store, Group: h.cfg.Group,
		Topics: []string{topic}, Timeout: 10 * time.Second, KgoOpts: h.cfg.Kafka})
	if err != nil {
		return from, to, err
	}
	defer c.Close()
	return c.ResetTopic(ctx, status.TopicResetRequest{Topic: topic, Growth: growth, Reason: reason, Claimant: claimant})
}

// claimant is who the harness's resets are recorded as.
const claimant = "operator:baton-chaos"

// pauseAndDrain stops the producer and waits until everything it produced is applied. The
// returned function resumes the producer (once; also on failure).
func (h *harness) pauseAndDrain(ctx context.Context, topic string) (resume func(), err error) {
	resumed := false
	resume = func() {
		if !resumed {
			resumed = true
			h.builtin.resume()
		}
	}
	if err := h.builtin.pause(ctx, time.Minute); err != nil {
		return resume, err
	}
	return resume, h.drain(ctx, topic, 3*h.cfg.SessionTimeout+90*time.Second)
}

// topicRecreate is FaultTopicRecreate.
func (h *harness) topicRecreate(ctx context.Context, f *Fault) {
	st := h.cfg.SessionTimeout
	topic := h.cfg.Topic
	f.Target = topic
	if h.builtin == nil || h.cfg.Mode != Fenced {
		f.Detail = "skipped: needs the built-in workload in fenced mode"
		return
	}
	var ev []string
	defer func() { f.Detail = strings.Join(ev, "; ") }()
	resume, err := h.pauseAndDrain(ctx, topic)
	defer resume()
	if err != nil {
		ev = append(ev, "producer paused; "+err.Error())
		return
	}
	old, err := h.describe(ctx, topic)
	if err != nil || !old.exists {
		ev = append(ev, fmt.Sprintf("cannot describe %s: %v", topic, err))
		return
	}
	keyed := keyedParts(h.cfg.Workload.Keys, old.parts)
	ev = append(ev, fmt.Sprintf("producer paused, everything applied; %s had ID %s, %d partitions (keys produced to %d)", topic, old.idText(), old.parts, len(keyed)))
	marks := h.logMarks()

	changed := time.Now()
	if _, err := h.adm.DeleteTopic(ctx, topic); err != nil {
		ev = append(ev, "delete: "+err.Error())
		return
	}
	if _, err := h.awaitTopic(ctx, topic, time.Minute, func(s topicState) bool { return !s.exists }); err != nil {
		ev = append(ev, "delete: "+err.Error())
		return
	}
	rf := int16(1)
	if h.cfg.KafkaNodes > 1 {
		rf = -1
	}
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := h.adm.CreateTopic(ctx, old.parts, rf, nil, topic)
		if err == nil {
			err = resp.Err
		}
		if err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil { // the topic lost: no run can settle
			ev = append(ev, "create again: "+err.Error())
			h.recordChange(ctx, topic, f.Kind, changed, time.Time{})
			return
		}
		sleep(ctx, 500*time.Millisecond) // still being deleted
	}
	now, err := h.awaitTopic(ctx, topic, time.Minute, func(s topicState) bool { return s.exists && s.ready && s.parts == old.parts })
	recreated := err == nil && now.id != old.id && now.id != [16]byte{}
	ev = append(ev, fmt.Sprintf("deleted and created again: ID %s, %d partitions (ID changed: %v)", now.idText(), now.parts, recreated))
	// The harness's producer forgets the old incarnation (franz-go keeps a topic's ID).
	h.cl.PurgeTopicsFromClient(topic)

	// The consumers hold every partition of the new incarnation at its claim.
	held := h.awaitHeld(ctx, marks, topic, "recreated", partsBelow(0, old.parts), 3*st+30*time.Second)
	ev = append(ev, fmt.Sprintf("held at their claims: %d of %d partitions", len(held), old.parts))
	resume()
	waiting := h.awaitEnds(ctx, topic, keyed, nil, 30*time.Second)
	sleep(ctx, 2*st) // time for a worker that does not hold to apply them
	early := h.appliedSince(ctx, topic, changed.UnixMilli())
	ev = append(ev, fmt.Sprintf("producing resumed: records waiting on every partition keys are produced to %v; batches applied before the reset: %d", waiting, early))

	reason := fmt.Sprintf("chaos fault topic-recreate at %s", changed.Format("15:04:05.000"))
	released := time.Now()
	from, to, err := h.release(ctx, topic, false, reason)
	h.recordChange(ctx, topic, f.Kind, changed, released)
	if err != nil {
		ev = append(ev, "baton topics reset: "+err.Error())
		return
	}
	ev = append(ev, fmt.Sprintf("baton topics reset: %s -> %s", from, to))
	eras, err := h.recordIncarnation(ctx, topic, reason)
	if err != nil || len(eras) < int(old.parts) {
		ev = append(ev, fmt.Sprintf("the reset's eras: %v (%v)", eras, err))
		return
	}
	// The new incarnation is applied from its beginning on every partition with records.
	from0 := 0
	deadline = time.Now().Add(3*st + 60*time.Second)
	for from0 < len(keyed) && time.Now().Before(deadline) && ctx.Err() == nil {
		from0 = 0
		for p, era := range eras {
			var n int64
			if keyed[p] && h.db.QueryRow(ctx, `SELECT count(*) FROM chaos_applied WHERE topic = $1 AND part = $2 AND era >= $3 AND first_off = 0`, topic, p, era).Scan(&n) == nil && n > 0 {
				from0++
			}
		}
		if from0 < len(keyed) {
			sleep(ctx, 250*time.Millisecond)
		}
	}
	ev = append(ev, fmt.Sprintf("new incarnation applied from offset 0 on %d of the %d partitions keys are produced to", from0, len(keyed)))
	f.Bit = recreated && len(held) == int(old.parts) && waiting && early == 0 && from0 == len(keyed)
	f.End = time.Now()
}

// topicGrow is FaultTopicGrow.
func (h *harness) topicGrow(ctx context.Context, f *Fault) {
	st := h.cfg.SessionTimeout
	topic := h.cfg.Topic
	f.Target = topic
	if h.builtin == nil || h.cfg.Mode != Fenced {
		f.Detail = "skipped: needs the built-in workload in fenced mode"
		return
	}
	var ev []string
	defer func() { f.Detail = strings.Join(ev, "; ") }()
	resume, err := h.pauseAndDrain(ctx, topic)
	defer resume()
	if err != nil {
		ev = append(ev, "producer paused; "+err.Error())
		return
	}
	old, err := h.describe(ctx, topic)
	if err != nil || !old.exists {
		ev = append(ev, fmt.Sprintf("cannot describe %s: %v", topic, err))
		return
	}
	want := growTo(old.parts, h.cfg.Workload.Keys)
	keyed, added := keyedParts(h.cfg.Workload.Keys, want), partsBelow(old.parts, want)
	// Held: every new partition at its claim, every older one with records before its next batch.
	mustHold := maps.Clone(added)
	newKeyed := 0
	for p := range keyed {
		mustHold[p] = true
		if added[p] {
			newKeyed++
		}
	}
	floor := map[int32]int64{}
	if ends, err := h.adm.ListEndOffsets(ctx, topic); err == nil {
		ends.Each(func(o kadm.ListedOffset) { floor[o.Partition] = o.Offset })
	}
	ev = append(ev, fmt.Sprintf("producer paused, everything applied; growing %s from %d to %d partitions (keys produced to %d, %d of them new)", topic, old.parts, want, len(keyed), newKeyed))
	marks := h.logMarks()

	changed := time.Now()
	resp, err := h.adm.CreatePartitions(ctx, int(want-old.parts), topic)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		ev = append(ev, "create partitions: "+err.Error())
		return
	}
	now, err := h.awaitTopic(ctx, topic, time.Minute, func(s topicState) bool { return s.ready && s.parts == want })
	grown := err == nil && now.id == old.id
	ev = append(ev, fmt.Sprintf("grown: %d partitions, same ID %v", now.parts, grown))
	h.cl.PurgeTopicsFromClient(topic) // the producer spreads keys over the new count

	// The new partitions are held at their claims; the older ones compare again before their
	// next batch once a member looked (every 5 s): produce only after that.
	newHeld := h.awaitHeld(ctx, marks, topic, "grown", added, 3*st+30*time.Second)
	sleep(ctx, time.Until(changed.Add(topicLookWait)))
	resume()
	waiting := h.awaitEnds(ctx, topic, keyed, floor, 30*time.Second)
	held := h.awaitHeld(ctx, marks, topic, "grown", mustHold, 3*st+30*time.Second)
	unheld := missing(held, mustHold)
	sleep(ctx, 2*st) // time for a worker that does not hold to apply them
	early := h.appliedSince(ctx, topic, changed.UnixMilli())
	ev = append(ev, fmt.Sprintf("held before producing: %d partitions; producing resumed: records waiting on every partition keys are produced to %v; held: %d of %d partitions (not held of the new ones and those keys are produced to: %v); batches applied before the acknowledgement: %d",
		len(newHeld), waiting, len(held), want, unheld, early))

	released := time.Now()
	from, to, err := h.release(ctx, topic, true, fmt.Sprintf("chaos fault topic-grow at %s, drained before", changed.Format("15:04:05.000")))
	h.recordChange(ctx, topic, f.Kind, changed, released)
	if err != nil {
		ev = append(ev, "baton topics ack: "+err.Error())
		return
	}
	ev = append(ev, fmt.Sprintf("baton topics ack: %s -> %s", from, to))
	// The new partitions are applied after the acknowledgement.
	var applied int64
	deadline := time.Now().Add(3*st + 60*time.Second)
	for applied < int64(newKeyed) && time.Now().Before(deadline) && ctx.Err() == nil {
		if h.db.QueryRow(ctx, `SELECT count(DISTINCT part) FROM chaos_applied WHERE topic = $1 AND part >= $2 AND at_ms >= $3`, topic, old.parts, released.UnixMilli()).Scan(&applied) != nil {
			applied = 0
		}
		sleep(ctx, 250*time.Millisecond)
	}
	ev = append(ev, fmt.Sprintf("new partitions applied after it: %d of the %d keys are produced to", applied, newKeyed))
	f.Bit = grown && waiting && len(unheld) == 0 && early == 0 && newKeyed > 0 && applied == int64(newKeyed)
	f.End = time.Now()
}

// awaitHeld waits until workers logged the hold (why) of every partition of topic in want since
// marks (at most wait) and returns the partitions seen.
func (h *harness) awaitHeld(ctx context.Context, marks map[string]int64, topic, why string, want map[int32]bool, wait time.Duration) map[int32]bool {
	deadline := time.Now().Add(wait)
	for {
		got := h.held(marks, topic, why)
		if len(missing(got, want)) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return got
		}
		sleep(ctx, 250*time.Millisecond)
	}
}

// partsBelow returns the partitions from through to-1.
func partsBelow(from, to int32) map[int32]bool {
	out := map[int32]bool{}
	for p := from; p < to; p++ {
		out[p] = true
	}
	return out
}

// missing returns the partitions of want that got lacks, in order.
func missing(got, want map[int32]bool) []int32 {
	var out []int32
	for p := range want {
		if !got[p] {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// recordChange logs a topic change for the checker: nothing of topic may be applied from
// changed until released (zero: never released).
func (h *harness) recordChange(ctx context.Context, topic string, kind FaultKind, changed, released time.Time) {
	var rel int64
	if !released.IsZero() {
		rel = released.UnixMilli()
	}
	_ = h.db.Exec(context.WithoutCancel(ctx), `INSERT INTO chaos_topic_changes (topic, kind, changed_ms, released_ms) VALUES ($1, $2, $3, $4)`,
		topic, string(kind), changed.UnixMilli(), rel)
}

// recordIncarnation records the era each partition's fence was reset to (read from the
// recoveries the reset recorded with its reason): the new incarnation's offsets start at 0 in
// it, for the checker and for caughtUp.
func (h *harness) recordIncarnation(ctx context.Context, topic, reason string) (map[int32]int64, error) {
	rows, err := h.db.Query(ctx, `SELECT partition, to_era FROM baton_fences_recoveries WHERE group_id = $1 AND topic = $2 AND reason = $3`,
		h.cfg.Group, topic, reason+" (by "+claimant+")")
	if err != nil {
		return nil, err
	}
	eras := map[int32]int64{}
	for rows.Next() {
		var p int32
		var era int64
		if err := rows.Scan(&p, &era); err != nil {
			rows.Close()
			return nil, err
		}
		eras[p] = era
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for p, era := range eras {
		if err := h.db.Exec(context.WithoutCancel(ctx), `INSERT INTO chaos_incarnations (topic, part, era) VALUES ($1, $2, $3)`, topic, p, era); err != nil {
			return eras, err
		}
	}
	return eras, nil
}
