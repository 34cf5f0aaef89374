package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestLatencyWindow: only records produced from the first commit plus the warm-up count, each
// from its produce timestamp to its batch's commit; a committed offset never fetched is
// counted as unstamped.
func TestLatencyWindow(t *testing.T) {
	l := newLatencies(time.Second)
	t0 := time.Unix(1000, 0)
	first := t0.Add(500 * time.Millisecond) // the window starts at t0 + 1.5s
	for o, at := range []time.Duration{0, time.Second, 2 * time.Second, 3 * time.Second} {
		l.stamp(&kgo.Record{Partition: 1, Offset: int64(o), Timestamp: t0.Add(at)})
	}
	l.landed(first, 1, 0, 1, 10*time.Millisecond, t0.Add(1200*time.Millisecond)) // before the window
	l.landed(first, 1, 2, 2, 20*time.Millisecond, t0.Add(2050*time.Millisecond)) // 50ms
	l.landed(first, 1, 3, 4, 30*time.Millisecond, t0.Add(3010*time.Millisecond)) // 10ms, offset 4 unstamped
	got := l.result()
	if got.Records != 2 || got.Batches != 2 || got.Unstamped != 1 {
		t.Fatalf("records %d, batches %d, unstamped %d; want 2, 2, 1", got.Records, got.Batches, got.Unstamped)
	}
	if got.P50 != 50*time.Millisecond || got.Max != 50*time.Millisecond || got.P99 != 50*time.Millisecond {
		t.Errorf("p50 %v p99 %v max %v; want 50ms each (of 10ms and 50ms, the upper median)", got.P50, got.P99, got.Max)
	}
	if got.CommitP50 != 30*time.Millisecond {
		t.Errorf("commit p50 %v, want 30ms (the window's transactions only)", got.CommitP50)
	}
	if got.Window != 1510*time.Millisecond || got.Batch() != 1 {
		t.Errorf("window %v, batch %v; want 1.51s (window start to last commit), 1", got.Window, got.Batch())
	}
}

// TestRecorderLatencyAndPhases: CommittedRange counts the range's records and, with a latency
// run, times them; phases stop at the first commit and list it.
func TestRecorderLatencyAndPhases(t *testing.T) {
	rec := NewRecorder(3)
	rec.e2e = newLatencies(0)
	rec.Start()
	rec.Phase(PhaseJoined, false)
	rec.Phase(PhaseProved, true)
	time.Sleep(2 * time.Millisecond)
	rec.Phase(PhaseJoined, false) // the first one stays
	rec.Phase(PhaseProved, true)  // the latest one stays
	now := time.Now()
	for o := range int64(3) {
		rec.e2e.stamp(&kgo.Record{Partition: 0, Offset: o, Timestamp: now.Add(time.Second)})
	}
	rec.CommittedRange(0, 0, 2, time.Millisecond)
	rec.Phase(PhaseFetched, false) // after the first commit: ignored
	select {
	case <-rec.Done():
	default:
		t.Fatal("3 records committed, the recorder is not done")
	}
	if l := rec.latency(); l == nil || l.Records != 3 {
		t.Fatalf("latency %+v, want 3 records", l)
	}
	ps := rec.phaseList()
	var names []string
	for _, p := range ps {
		names = append(names, p.Name)
	}
	if strings.Join(names, ",") != "joined,proved,first commit" {
		t.Fatalf("phases %v", ps)
	}
	if ps[1].At-ps[0].At < 2*time.Millisecond {
		t.Errorf("proved at %v, joined at %v: the later proof was not kept", ps[1].At, ps[0].At)
	}
	if !strings.Contains(PhaseLine(ps), "joined ") {
		t.Errorf("phase line %q", PhaseLine(ps))
	}
}

func TestParseRate(t *testing.T) {
	for in, want := range map[string]Rate{"10000": {PerSecond: 10000}, "50%": {Fraction: 0.5}, "25%baton-fast": {Fraction: 0.25, Of: "baton-fast"}} {
		got, err := ParseRate(in)
		if err != nil || got != want {
			t.Errorf("ParseRate(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "-5", "x", "0%", "150%", "50%nope"} {
		if _, err := ParseRate(in); err == nil {
			t.Errorf("ParseRate(%q) accepted", in)
		}
	}
	if b := (Rate{Fraction: 0.5}).base(KafkaReadDesign); b != Reference {
		t.Errorf("kafka-read's percentage is of %s, want %s", b, Reference)
	}
}

// TestPad: a padded record is exactly the size asked; a larger one is left alone.
func TestPad(t *testing.T) {
	recs := Records(2, 2)
	pad(recs, 100)
	for _, r := range recs {
		n := len(r.Key) + len(r.Value)
		for _, h := range r.Headers {
			n += len(h.Key) + len(h.Value)
		}
		if n != 100 {
			t.Errorf("record %s/%s is %d bytes, want 100", r.Key, r.Value, n)
		}
	}
	small := Records(1, 1)
	pad(small, 10)
	if len(small[0].Headers) != 2 {
		t.Errorf("a record larger than the size was padded: %v", small[0].Headers)
	}
}

// TestFetchOpts: only the settings given become options.
func TestFetchOpts(t *testing.T) {
	if n := len((FetchSettings{}).FetchOpts()); n != 0 {
		t.Errorf("no settings gave %d options", n)
	}
	if n := len((FetchSettings{FetchMaxWait: time.Second, FetchMaxPartitionBytes: 1 << 17}).FetchOpts()); n != 2 {
		t.Errorf("two settings gave %d options", n)
	}
}
