package pgoutbox_test

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/outbox"
)

// Rows a broker refuses for good, on PostgreSQL and on kfake and the real
// broker: a row larger than its topic's max.message.bytes and a row whose topic was deleted are
// dead-lettered under the fence with their reasons, each flush returns within FlushTimeout
// meanwhile, and the rows behind them are delivered in order.
func TestUndeliverableRowsAreDeadLettered(t *testing.T) {
	brokers(t, func(t *testing.T, bs []string, dest string) {
		e := newEnv(t)
		tok := fence.Token{Epoch: 1}
		e.claim(tok)
		cl := client(t, bs, kgo.UnknownTopicRetries(-1))
		adm := kadm.NewClient(cl)
		small, gone := testenv.UniqueName("small"), testenv.UniqueName("gone")
		for _, c := range []struct {
			name string
			cfg  map[string]*string
		}{{small, map[string]*string{"max.message.bytes": kadm.StringPtr("1000")}}, {gone, nil}} {
			resp, err := adm.CreateTopic(e.ctx, 1, 1, c.cfg, c.name)
			if err == nil {
				err = resp.Err
			}
			if err != nil {
				t.Fatalf("create %s: %v", c.name, err)
			}
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, _ = adm.DeleteTopics(ctx, small, gone)
		})
		if _, err := adm.DeleteTopics(e.ctx, gone); err != nil { // deleted before the rows are relayed
			t.Fatal(err)
		}
		big := make([]byte, 3000) // incompressible, above small's max.message.bytes, below the append check
		if _, err := rand.Read(big); err != nil {
			t.Fatal(err)
		}
		if err := e.apply(e.ctx, tok, 1,
			outbox.Message{Topic: dest, Key: []byte("k"), Value: []byte("1")},
			outbox.Message{Topic: small, Key: []byte("k"), Value: big},
			outbox.Message{Topic: dest, Key: []byte("k"), Value: []byte("3")},
			outbox.Message{Topic: gone, Key: []byte("k"), Value: []byte("4")},
			outbox.Message{Topic: dest, Key: []byte("k"), Value: []byte("5")}); err != nil {
			t.Fatal(err)
		}
		const timeout = 2 * time.Second
		r := relay(t, cl, e.store, outbox.FlushTimeout(timeout), outbox.GiveUpAfter(time.Second))
		start := time.Now()
		for e.backlog() > 0 {
			if time.Since(start) > 30*time.Second {
				t.Fatalf("backlog %d after 30s", e.backlog())
			}
			began := time.Now()
			_, err := r.Flush(e.ctx, e.src, tok)
			if took := time.Since(began); took > timeout+2*time.Second {
				t.Fatalf("Flush took %v (%v), FlushTimeout %v", took, err, timeout)
			}
			if err != nil && !strings.Contains(err.Error(), "UNKNOWN_TOPIC") && !strings.Contains(err.Error(), "flush timeout") {
				t.Fatalf("Flush: %v", err)
			}
		}
		dl, err := e.store.DeadLetters(e.ctx, e.src, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(dl) != 2 || dl[0].Seq != 2 || dl[1].Seq != 4 ||
			!strings.HasPrefix(dl[0].Reason, "message_too_large"+": ") ||
			!strings.HasPrefix(dl[1].Reason, "unknown_topic"+": ") || dl[1].Topic != gone || dl[0].By != tok {
			for _, d := range dl {
				t.Logf("dead letter seq %d topic %s reason %q", d.Seq, d.Topic, d.Reason)
			}
			t.Fatalf("dead letters: want seq 2 %s and seq 4 %s", "message_too_large", "unknown_topic")
		}
		// dest got 1, 3, 5, first seen in that order (3 and 5 maybe again: re-published copies
		// of rows that shared a batch with a stuck row).
		cons := client(t, bs, kgo.ConsumeTopics(dest), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		ctx, cancel := context.WithTimeout(e.ctx, 15*time.Second)
		defer cancel()
		var first []string
		seen := map[string]bool{}
		for !seen["5"] && ctx.Err() == nil {
			for _, rec := range cons.PollFetches(ctx).Records() {
				if v := string(rec.Value); !seen[v] {
					seen[v] = true
					first = append(first, v)
				}
			}
		}
		if strings.Join(first, ",") != "1,3,5" {
			t.Fatalf("dest holds %v (first occurrences), want 1, 3, 5", first)
		}
	})
}
