package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestKeyedPartsAsProduced: keyedParts names the partitions the harness's producer (franz-go's
// default partitioner) puts the workload's keys on, and a grown topic may have partitions no key
// is produced to (200 keys over 40 partitions leave partition 32 empty).
func TestKeyedPartsAsProduced(t *testing.T) {
	const keys, parts = 200, 40
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(parts, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := map[int32]bool{}
	for k := range keys {
		r, err := cl.ProduceSync(ctx, &kgo.Record{Topic: "t", Key: []byte(Key(k)), Value: []byte("0")}).First()
		if err != nil {
			t.Fatal(err)
		}
		got[r.Partition] = true
	}
	if want := keyedParts(keys, parts); !reflect.DeepEqual(got, want) {
		t.Fatalf("keys produced to %d partitions %v; keyedParts says %d: %v", len(got), got, len(want), want)
	}
	if got[32] || len(got) != parts-1 {
		t.Fatalf("%d keys over %d partitions: %d partitions with records, partition 32 among them %v; want every one but 32", keys, parts, len(got), got[32])
	}
}

// TestGrowTo: a topic grows by half (6 -> 9) while it has fewer partitions than a quarter of the
// keys, then by one; every growth adds a partition some key is produced to, and fifty growths
// stay within reach of a broker.
func TestGrowTo(t *testing.T) {
	if got := growTo(6, 60); got != 9 {
		t.Errorf("growTo(6, 60) = %d, want 9", got)
	}
	if got := growTo(12, 200); got != 18 {
		t.Errorf("growTo(12, 200) = %d, want 18", got)
	}
	for _, c := range []struct {
		parts int32
		keys  int
		most  int32
	}{{6, 60, 90}, {12, 200, 130}, {3, 30, 120}} {
		p := c.parts
		for i := range 50 {
			q := growTo(p, c.keys)
			if q <= p {
				t.Fatalf("%d keys: growth %d from %d partitions to %d", c.keys, i+1, p, q)
			}
			if int(p) >= c.keys/4 && q > p+1 && keyedParts(c.keys, p+1)[p] {
				t.Fatalf("%d keys: growth %d from %d partitions to %d, want by one past a quarter of the keys", c.keys, i+1, p, q)
			}
			keyed, added := keyedParts(c.keys, q), 0
			for n := p; n < q; n++ {
				if keyed[n] {
					added++
				}
			}
			if added == 0 {
				t.Fatalf("%d keys: growth %d from %d to %d partitions adds none a key is produced to", c.keys, i+1, p, q)
			}
			p = q
		}
		if p > c.most {
			t.Errorf("%d keys from %d partitions: %d partitions after fifty growths, want at most %d", c.keys, c.parts, p, c.most)
		}
	}
}

// TestHeldSinceMarks: held reads the holds a worker logged after the marks, of the topic and
// the cause asked for, across incarnations of the topic and log files opened after the marks.
func TestHeldSinceMarks(t *testing.T) {
	dir := t.TempDir()
	line := func(why, topic string, p int) string {
		msg := "topic recreated: its ID differs from the one stored with the fences; partition held (nothing applied) until an operator resets it with baton topics reset"
		if why == "grown" {
			msg = "topic grown: this partition is at or above the acknowledged partition count; partition held (nothing applied) until an operator drains the older partitions and acknowledges the growth with baton topics ack"
		}
		return fmt.Sprintf("time=2026-01-01T00:00:00.000Z level=ERROR msg=%q worker=w1 group=g topic=%s partition=%d err=\"fence: topic g/%s/%d was grown from 12 to 18 partitions\" stored=\"a with 12 partitions\" seen=\"a with 18 partitions\"\n",
			msg, topic, p, topic, p)
	}
	write := func(name string, lines ...string) string {
		p := filepath.Join(dir, name)
		f, err := os.OpenFile(p, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, l := range lines {
			if _, err := f.WriteString(l); err != nil {
				t.Fatal(err)
			}
		}
		return p
	}
	h := &harness{}
	w1 := write("w1.log", line("recreated", "src", 0), line("grown", "src", 1), line("grown", "src", 2)) // earlier incarnations
	h.logs = []string{w1}
	marks := h.logMarks()
	write("w1.log", line("grown", "src", 3), line("grown", "src-commands", 4), line("recreated", "src", 5), "time=x level=INFO msg=\"claimed\" topic=src partition=6\n")
	h.logs = append(h.logs, write("w2.log", line("grown", "src", 7))) // a worker started after the marks
	if got, want := h.held(marks, "src", "grown"), map[int32]bool{3: true, 7: true}; !reflect.DeepEqual(got, want) {
		t.Errorf("grown since the marks: %v, want %v", got, want)
	}
	if got, want := h.held(marks, "src", "recreated"), map[int32]bool{5: true}; !reflect.DeepEqual(got, want) {
		t.Errorf("recreated since the marks: %v, want %v", got, want)
	}
	if got := missing(h.held(marks, "src", "grown"), partsBelow(3, 8)); !reflect.DeepEqual(got, []int32{4, 5, 6}) {
		t.Errorf("missing of 3..7: %v, want [4 5 6]", got)
	}
}
