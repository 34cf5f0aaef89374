package fencetest

import (
	"errors"
	"math"
	"testing"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/fencecheck"
)

// The cases of fence.Topics, run when the store implements it.

func (s suite[Tx]) needTopics(t *testing.T) (Env[Tx], fence.Topics) {
	t.Helper()
	env := s.open(t)
	ts, ok := env.Sink.(fence.Topics)
	if !ok {
		t.Skip("the store does not implement fence.Topics")
	}
	return env, ts
}

const topicGroup = "fencetest"

func wantTopic(t *testing.T, ts fence.Topics, topic string, want fence.Topic, records int) {
	t.Helper()
	h, err := ts.TopicHistory(deadline(t), topicGroup, topic)
	if err != nil {
		t.Fatalf("TopicHistory: %v", err)
	}
	if len(h) != records {
		t.Fatalf("TopicHistory = %+v, want %d records", h, records)
	}
	for i, r := range h {
		if r.Seq != int64(i+1) || r.Reason == "" || r.Group != topicGroup || r.Topic != topic {
			t.Fatalf("record %d = %+v: want seq %d, a reason, the group and topic", i, r, i+1)
		}
	}
	if got := h[len(h)-1].Identity; got != want {
		t.Fatalf("latest identity %s, want %s", got, want)
	}
}

// topicAdopt: the first sight of a topic adopts it (recorded); later sights never change it,
// and a different ID is reported by the rule as recreated, a higher partition as grown.
func (s suite[Tx]) topicAdopt(t *testing.T) {
	_, ts := s.needTopics(t)
	ctx := deadline(t)
	a := fence.Topic{ID: "idA", Partitions: 6}
	got, adopted, err := ts.SeeTopic(ctx, topicGroup, "adopt", a, "first claim")
	if err != nil || !adopted || got != a {
		t.Fatalf("SeeTopic on a new topic = %s, %v, %v; want %s adopted", got, adopted, err, a)
	}
	b := fence.Topic{ID: "idB", Partitions: 9}
	got, adopted, err = ts.SeeTopic(ctx, topicGroup, "adopt", b, "second claim")
	if err != nil || adopted || got != a {
		t.Fatalf("SeeTopic with another identity = %s, %v, %v; want the stored %s, not adopted", got, adopted, err, a)
	}
	wantTopic(t, ts, "adopt", a, 1)
	k := fence.Key{Group: topicGroup, Topic: "adopt", Partition: 2}
	if _, err := fencecheck.CheckTopic(k, got, true, b); !errors.Is(err, fence.ErrTopicRecreated) {
		t.Fatalf("CheckTopic(%s against %s) = %v, want ErrTopicRecreated", b, got, err)
	}
	for _, p := range []int32{1, 7} { // every partition of a grown topic, old and new
		k.Partition = p
		if _, err := fencecheck.CheckTopic(k, got, true, fence.Topic{ID: "idA", Partitions: 9}); !errors.Is(err, fence.ErrTopicGrown) {
			t.Fatalf("CheckTopic(partition %d of %s seen with 9) = %v, want ErrTopicGrown", p, got, err)
		}
	}
	// A stored identity without an ID (a broker without topic IDs) adopts the first ID
	// seen, keeping its partition count: growth is never adopted silently.
	if _, _, err := ts.SeeTopic(ctx, topicGroup, "noid", fence.Topic{Partitions: 3}, "first claim"); err != nil {
		t.Fatal(err)
	}
	got, adopted, err = ts.SeeTopic(ctx, topicGroup, "noid", fence.Topic{ID: "idC", Partitions: 5}, "topic ids now known")
	if want := (fence.Topic{ID: "idC", Partitions: 3}); err != nil || !adopted || got != want {
		t.Fatalf("SeeTopic with an ID over one without = %s, %v, %v; want %s adopted", got, adopted, err, want)
	}
	wantTopic(t, ts, "noid", fence.Topic{ID: "idC", Partitions: 3}, 2)
	for _, bad := range []fence.Topic{{ID: "x", Partitions: 0}, {ID: "x\x00", Partitions: 1}} {
		if _, _, err := ts.SeeTopic(ctx, topicGroup, "adopt", bad, "bad"); !errors.Is(err, fence.ErrInvalid) {
			t.Fatalf("SeeTopic(%q, %d) = %v, want ErrInvalid", bad.ID, bad.Partitions, err)
		}
	}
	if _, _, err := ts.SeeTopic(ctx, topicGroup, "adopt", a, ""); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("SeeTopic without a reason = %v, want ErrInvalid", err)
	}
}

// topicResetRecreated: resetting a recreated topic moves every fence of the topic (claimed
// ones and those below the partition count never claimed) to a new era with no claimant and
// no position, recorded as recoveries; the old incarnation's token is refused afterwards and
// the next owner resumes from the new log's beginning.
func (s suite[Tx]) topicResetRecreated(t *testing.T) {
	env, ts := s.needTopics(t)
	ctx := deadline(t)
	const topic = "recreated"
	a := fence.Topic{ID: "idA", Partitions: 2}
	if _, _, err := ts.SeeTopic(ctx, topicGroup, topic, a, "first claim"); err != nil {
		t.Fatal(err)
	}
	k0 := fence.Key{Group: topicGroup, Topic: topic, Partition: 0}
	k1 := fence.Key{Group: topicGroup, Topic: topic, Partition: 1}
	claim(t, env, k0, tok(0, 5))
	mustApply(t, env, k0, tok(0, 5), 41)
	b := fence.Topic{ID: "idB", Partitions: 3}
	if err := ts.ResetTopic(ctx, topicGroup, topic, fence.Topic{ID: "idX", Partitions: 2}, b, "wrong expectation"); !errors.Is(err, fence.ErrConflict) {
		t.Fatalf("ResetTopic from a wrong expected identity = %v, want ErrConflict", err)
	}
	if err := ts.ResetTopic(ctx, topicGroup, topic, a, b, ""); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("ResetTopic without a reason = %v, want ErrInvalid", err)
	}
	wantState(t, env, k0, fence.State{Token: tok(0, 5), Position: 41, Claimant: owner})
	if err := ts.ResetTopic(ctx, topicGroup, topic, a, b, "operator: topic recreated"); err != nil {
		t.Fatalf("ResetTopic: %v", err)
	}
	wantTopic(t, ts, topic, b, 2)
	wantState(t, env, k0, fence.State{Token: tok(1, 0), Position: fence.NoPosition})
	wantState(t, env, k1, fence.State{Token: tok(1, 0), Position: fence.NoPosition})
	wantState(t, env, fence.Key{Group: topicGroup, Topic: topic, Partition: 2}, fence.State{Token: tok(1, 0), Position: fence.NoPosition})
	wantStale(t, apply(t, env, k0, tok(0, 5), 42), k0, tok(1, 0), tok(0, 5))
	if _, err := env.Sink.Claim(ctx, k0, tok(0, 9), owner); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("a claim of the old era after the reset = %v, want ErrStale", err)
	}
	if st := claim(t, env, k0, tok(1, 6)); st.Position != fence.NoPosition {
		t.Fatalf("claim after the reset resumes at %d, want NoPosition", st.Position)
	}
	mustApply(t, env, k0, tok(1, 6), 0)
	for _, k := range []fence.Key{k0, k1} {
		rs, err := env.Sink.Recoveries(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) != 1 || rs[0].To != tok(1, 0) || rs[0].Reason != "operator: topic recreated" {
			t.Fatalf("Recoveries(%s) = %+v, want one to 1.0 with the reason", k, rs)
		}
	}
	if err := ts.ResetTopic(ctx, topicGroup, topic, a, b, "again"); !errors.Is(err, fence.ErrConflict) {
		t.Fatalf("the same reset again = %v, want ErrConflict", err)
	}
}

// topicResetKeepsSealed: a sealed fence (epoch math.MaxInt64, taken by a claim or a
// recovery) stays sealed through a recreated topic's reset: the next era, epoch
// math.MaxInt64, its claimant kept, recorded as a recovery; no claim in the new era takes it.
func (s suite[Tx]) topicResetKeepsSealed(t *testing.T) {
	env, ts := s.needTopics(t)
	ctx := deadline(t)
	const topic, sealer = "sealed", "fencetest/sealer"
	a := fence.Topic{ID: "idA", Partitions: 3}
	if _, _, err := ts.SeeTopic(ctx, topicGroup, topic, a, "first claim"); err != nil {
		t.Fatal(err)
	}
	k0 := fence.Key{Group: topicGroup, Topic: topic, Partition: 0} // sealed by a claim, never claimed before
	k1 := fence.Key{Group: topicGroup, Topic: topic, Partition: 1} // sealed by a recovery of a claimed fence
	k2 := fence.Key{Group: topicGroup, Topic: topic, Partition: 2} // claimed, not sealed
	if _, err := env.Sink.Claim(ctx, k0, tok(0, math.MaxInt64), sealer); err != nil {
		t.Fatalf("sealing claim: %v", err)
	}
	claim(t, env, k1, tok(0, 5))
	mustApply(t, env, k1, tok(0, 5), 7)
	if _, err := env.Sink.Recover(ctx, k1, tok(0, 5), math.MaxInt64, sealer, "seal"); err != nil {
		t.Fatalf("sealing recovery: %v", err)
	}
	claim(t, env, k2, tok(0, 5))
	if err := ts.ResetTopic(ctx, topicGroup, topic, a, fence.Topic{ID: "idB", Partitions: 3}, "operator: topic recreated"); err != nil {
		t.Fatalf("ResetTopic: %v", err)
	}
	wantState(t, env, k0, fence.State{Token: tok(1, math.MaxInt64), Position: fence.NoPosition, Claimant: sealer})
	wantState(t, env, k1, fence.State{Token: tok(2, math.MaxInt64), Position: fence.NoPosition, Claimant: sealer})
	wantState(t, env, k2, fence.State{Token: tok(1, 0), Position: fence.NoPosition})
	for _, k := range []fence.Key{k0, k1} {
		st, err := env.Sink.Load(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := env.Sink.Claim(ctx, k, fence.Token{Era: st.Token.Era, Epoch: 9}, owner); !errors.Is(err, fence.ErrStale) {
			t.Fatalf("a claim of %s in the new era after the reset = %v, want ErrStale (the fence stays sealed)", k, err)
		}
		rs, err := env.Sink.Recoveries(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if last := rs[len(rs)-1]; last.To != st.Token || last.Reason != "operator: topic recreated" {
			t.Fatalf("Recoveries(%s) = %+v, want the last to %s with the reset's reason", k, rs, st.Token)
		}
	}
}

// topicGrowthAck: acknowledging growth changes the partition count only; fences keep their
// tokens and positions. A topic never shrinks.
func (s suite[Tx]) topicGrowthAck(t *testing.T) {
	env, ts := s.needTopics(t)
	ctx := deadline(t)
	const topic = "grown"
	six := fence.Topic{ID: "idA", Partitions: 6}
	if _, _, err := ts.SeeTopic(ctx, topicGroup, topic, six, "first claim"); err != nil {
		t.Fatal(err)
	}
	k := fence.Key{Group: topicGroup, Topic: topic, Partition: 1}
	claim(t, env, k, tok(0, 3))
	mustApply(t, env, k, tok(0, 3), 10)
	nine := fence.Topic{ID: "idA", Partitions: 9}
	if err := ts.ResetTopic(ctx, topicGroup, topic, six, nine, "operator: growth to 9 acknowledged after draining"); err != nil {
		t.Fatalf("ResetTopic (growth): %v", err)
	}
	wantTopic(t, ts, topic, nine, 2)
	wantState(t, env, k, fence.State{Token: tok(0, 3), Position: 10, Claimant: owner})
	mustApply(t, env, k, tok(0, 3), 11)
	if err := ts.ResetTopic(ctx, topicGroup, topic, nine, six, "shrink"); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("ResetTopic shrinking = %v, want ErrInvalid", err)
	}
	if err := ts.ResetTopic(ctx, topicGroup, topic, nine, nine, "nothing"); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("ResetTopic changing nothing = %v, want ErrInvalid", err)
	}
	if err := ts.ResetTopic(ctx, topicGroup, "never-seen", six, nine, "x"); !errors.Is(err, fence.ErrConflict) {
		t.Fatalf("ResetTopic of a topic never seen = %v, want ErrConflict", err)
	}
}
