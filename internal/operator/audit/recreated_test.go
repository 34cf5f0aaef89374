package audit_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/operator/audit"
)

// A topic deleted and recreated under the same name, held until its reset: the fences hold the
// old incarnation's positions, past the new log's end, then below it and standing still. While
// the brokers' topic ID is not the one stored with the fences no Skipped or Liveness violation
// is reported and the report names the topic; after the reset the new incarnation is judged.
func TestRecreatedTopicNotJudgedUntilReset(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		e.produce(t, 10)
		e.claim(t, tok5)
		e.apply(t, tok5, 0, 8)
		old := e.identity(t)
		if _, _, err := e.topics.SeeTopic(ctx, e.group, e.src, old, "first claim"); err != nil {
			t.Fatal(err)
		}
		a, clk := e.auditor(t)
		if r := clean(t, a, "applied 0..8 of 10"); len(r.Recreated) != 0 {
			t.Fatalf("recreated %v before the topic was", r.Recreated)
		}
		next := e.recreate(t, 3)
		want := []audit.RecreatedTopic{{Topic: e.src, StoredID: old.ID, BrokerID: next.ID, Fences: 1}}
		for i := range 3 {
			r := clean(t, a, fmt.Sprintf("recreated, position 8 past the new log's end 3, pass %d", i))
			recreatedIs(t, r, want)
		}
		rec := httptest.NewRecorder()
		a.Handler(nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		if page := rec.Body.String(); !strings.Contains(page, "topic "+e.src+" recreated") || !strings.Contains(page, next.ID) {
			t.Errorf("the page does not name the recreated topic:\n%s", page)
		}
		e.produce(t, 20)
		for i := range 3 {
			clk.t = clk.t.Add(2 * time.Minute) // past the Stall bound, the new log 14 records past the position
			r := clean(t, a, fmt.Sprintf("recreated, the position standing still below the new log's end 23, pass %d", i))
			recreatedIs(t, r, want)
		}

		if err := e.topics.ResetTopic(ctx, e.group, e.src, old, next, "recreated by the test"); err != nil {
			t.Fatal(err)
		}
		recreatedIs(t, clean(t, a, "reset: no position"), nil)
		tok := fence.Token{Era: 1, Epoch: 6}
		e.claim(t, tok)
		e.apply(t, tok, 0, 1)
		recreatedIs(t, clean(t, a, "the new incarnation's first records applied"), nil)
		clk.t = clk.t.Add(2 * time.Minute)
		ev := within(t, e, a, audit.Liveness, "position has not moved")
		is(t, ev, "position", 1)
		is(t, ev, "high_watermark", 23)
	})
}

// The same positions against the same log, with the topic ID stored with the fences the
// brokers' own (a first claim adopting the new incarnation): the position past the log's end is
// reported.
func TestPositionPastLogEndJudgedUnderTheBrokersTopicID(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		e.produce(t, 10)
		e.claim(t, tok5)
		e.apply(t, tok5, 0, 8)
		next := e.recreate(t, 3)
		if _, _, err := e.topics.SeeTopic(context.Background(), e.group, e.src, next, "first claim"); err != nil {
			t.Fatal(err)
		}
		a, _ := e.auditor(t)
		recreatedIs(t, clean(t, a, "the position's first observation"), nil)
		ev := within(t, e, a, audit.Skipped, "sink position past the end of the log")
		is(t, ev, "position", 8)
		is(t, ev, "high_watermark", 3)
	})
}

// A recreated topic whose stored identity is unknown (none stored, or stored without an ID) is
// judged as any other: nothing tells the incarnations apart.
func TestPositionPastLogEndJudgedWithoutStoredTopicID(t *testing.T) {
	for _, stored := range []string{"none", "no id"} {
		t.Run(stored, func(t *testing.T) {
			both(t, func(t *testing.T, e *env) {
				e.produce(t, 10)
				e.claim(t, tok5)
				e.apply(t, tok5, 0, 8)
				if stored == "no id" {
					if _, _, err := e.topics.SeeTopic(context.Background(), e.group, e.src, fence.Topic{Partitions: 1}, "first claim"); err != nil {
						t.Fatal(err)
					}
				}
				a, _ := e.auditor(t)
				clean(t, a, "applied 0..8 of 10")
				e.recreate(t, 3)
				ev := within(t, e, a, audit.Skipped, "sink position past the end of the log")
				is(t, ev, "position", 8)
				is(t, ev, "high_watermark", 3)
			})
		})
	}
}

// A position read while its topic's offsets were another incarnation's is never compared with a
// later log, even when a later pass finds the two IDs the same with the fences unmoved (here the
// stored identity rewritten by hand): that pass reads the position anew, the next one judges it.
func TestPositionReadUnderAnotherIncarnationNotCarried(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		e.produce(t, 10)
		e.claim(t, tok5)
		e.apply(t, tok5, 0, 8)
		old := e.identity(t)
		if _, _, err := e.topics.SeeTopic(context.Background(), e.group, e.src, old, "first claim"); err != nil {
			t.Fatal(err)
		}
		a, _ := e.auditor(t)
		clean(t, a, "applied 0..8 of 10")
		next := e.recreate(t, 3)
		recreatedIs(t, clean(t, a, "recreated"), []audit.RecreatedTopic{{Topic: e.src, StoredID: old.ID, BrokerID: next.ID, Fences: 1}})
		e.exec(t, `UPDATE `+e.fenceTbl+`_topics SET topic_id = $1 WHERE `+e.grp+` = $2`, next.ID, e.group)
		recreatedIs(t, clean(t, a, "the same IDs, the position read under the old incarnation's offsets"), nil)
		ev := within(t, e, a, audit.Skipped, "sink position past the end of the log")
		is(t, ev, "position", 8)
		is(t, ev, "high_watermark", 3)
	})
}

func recreatedIs(t *testing.T, r *audit.Report, want []audit.RecreatedTopic) {
	t.Helper()
	if len(r.Recreated) != len(want) || len(want) > 0 && !reflect.DeepEqual(r.Recreated, want) {
		t.Fatalf("report's recreated topics %+v, want %+v", r.Recreated, want)
	}
}

// identity returns the source topic as the brokers describe it now.
func (e *env) identity(t *testing.T) fence.Topic {
	t.Helper()
	return topicIdentity(t, e.cl, e.src)
}

// topicIdentity returns topic as the brokers describe it now (zero if they do not know it).
func topicIdentity(t *testing.T, cl *kgo.Client, topic string) fence.Topic {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest() // not kadm's: its cached metadata may be the old incarnation's
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range resp.Topics {
		if d.Topic != nil && *d.Topic == topic && d.ErrorCode == 0 {
			return fence.Topic{ID: base64.RawURLEncoding.EncodeToString(d.TopicID[:]), Partitions: int32(len(d.Partitions))}
		}
	}
	return fence.Topic{}
}

// recreate deletes the source topic, creates it again under its name with one partition,
// produces n records to the new incarnation and returns its identity.
func (e *env) recreate(t *testing.T, n int) fence.Topic {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	old := e.identity(t)
	resp, err := e.adm.DeleteTopics(ctx, e.src)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatalf("delete topic %s: %v", e.src, err)
	}
	// A broker deletes a topic asynchronously: the name is free again when a create succeeds.
	for {
		r, err := e.adm.CreateTopic(ctx, 1, 1, nil, e.src)
		if err == nil {
			err = r.Err
		}
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("recreate topic %s: %v", e.src, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// A new client: the old one's metadata names the old incarnation.
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.DefaultProduceTopic(e.src), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	e.cl, e.adm = cl, kadm.NewClient(cl)
	var next fence.Topic
	for next = e.identity(t); next.ID == "" || next.ID == old.ID || next.Partitions != 1; next = e.identity(t) {
		if ctx.Err() != nil {
			t.Fatalf("topic %s not seen recreated: %+v, was %+v", e.src, next, old)
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.produce(t, n)
	return next
}
