package chaos

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestWorkerLogEvidence reads a coordinator-loading fault's evidence from a worker's log as the
// consumer writes it (lines from a real run): only the lines about the held partition, from the
// resume on, with their times and messages.
func TestWorkerLogEvidence(t *testing.T) {
	dir := t.TempDir()
	log := `time=2026-12-01T09:22:39.965Z level=ERROR msg="group session expired: no heartbeat answered for longer than the session timeout; every partition stopped until the group reassigns them" worker=w3 group=g since_last_answer=20.526s partitions="map[t:[3 2]]"
time=2026-12-01T09:22:40.001Z level=WARN msg="fence refused this member's write as stale; asking the coordinator whether this member still owns the partition" worker=w3 group=g topic=t partition=3 err="fence: stale token for g/t/3: presented 0.1, stored 0.2" presented=0.1 stored=0.2
time=2026-12-01T09:22:41.247Z level=INFO msg="claim refused as stale; asking the coordinator whether this member owns the partition" worker=w3 group=g topic=t partition=3 err="fence: stale token" presented=0.1 stored=0.2
time=2026-12-01T09:22:41.249Z level=INFO msg="claim refused as stale; asking the coordinator whether this member owns the partition" worker=w3 group=g topic=t partition=2 err="fence: stale token" presented=0.1 stored=0.2
time=2026-12-01T09:22:41.279Z level=ERROR msg="epoch regression: the coordinator confirms this member owns the partition, yet the sink refused its token" worker=w3 group=g topic=t partition=3 err="fence: epoch regression" presented=0.1 stored=0.2 recover=true
time=2026-12-01T09:22:41.567Z level=INFO msg="claim refused as stale; asking the coordinator whether this member owns the partition" worker=w3 group=g-gateway topic=t-commands partition=3 err="x"
time=2026-12-01T09:22:41.600Z level=INFO msg="claim refused as stale; asking the coordinator whether this member owns the partition" worker=w3 group=g topic=t partition=33 err="x"
`
	if err := os.WriteFile(filepath.Join(dir, "baton-chaos-w3-123.log"), []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	other := strings.ReplaceAll(log, "2026-12-01T09:22:4", "2026-12-01T09:22:5")
	if err := os.WriteFile(filepath.Join(dir, "baton-chaos-w31-456.log"), []byte(other), 0o600); err != nil {
		t.Fatal(err)
	}
	h := &harness{cfg: Config{LogDir: dir}}
	since, _ := time.Parse(time.RFC3339Nano, "2026-12-01T09:22:40.500Z")
	got := h.workerLog("w3", "t", 3, since)
	if len(got) != 2 {
		t.Fatalf("got %d lines, want 2 (partition 3 of topic t, from %s): %+v", len(got), since.Format(stamp), got)
	}
	if !strings.Contains(got[0].msg, askMsg) || got[0].at.Format(stamp) != "09:22:41.247" {
		t.Errorf("first line %s %q, want the claim's question at 09:22:41.247", got[0].at.Format(stamp), got[0].msg)
	}
	if !strings.Contains(got[1].msg, blindMsg) {
		t.Errorf("second line %q, want the confirmation", got[1].msg)
	}
	all := h.workerLog("w3", "t", 3, time.Time{})
	if len(all) != 3 || !strings.Contains(all[0].msg, askMsg) {
		t.Fatalf("from the start: %d lines, want 3 with the write's question first: %+v", len(all), all)
	}
	// Counted up to the coordinator's last loading answer: the claim's question, the write's,
	// the blind confirmation; a loading answer before the claim's question leaves only the write's.
	asked, wrote, blind, at := countAsks(all, all[2].at)
	if asked != 1 || wrote != 1 || blind != 1 || !at.Equal(all[1].at) {
		t.Errorf("countAsks = %d claim questions (first at %s), %d write questions, %d confirmations; want 1 (at %s), 1, 1",
			asked, at.Format(stamp), wrote, blind, all[1].at.Format(stamp))
	}
	if asked, wrote, blind, _ = countAsks(all, all[1].at.Add(-time.Millisecond)); asked != 0 || wrote != 1 || blind != 0 {
		t.Errorf("up to just before the claim: countAsks = %d, %d, %d; want 0, 1, 0", asked, wrote, blind)
	}
}

// TestGroupPartition checks the __consumer_offsets partition against Java's String.hashCode
// ("abc" is 96354; "polygenelubricants" hashes to Integer.MIN_VALUE, which Kafka's Utils.abs
// maps to 0).
func TestGroupPartition(t *testing.T) {
	for _, c := range []struct {
		group string
		parts int
		want  int32
	}{
		{"abc", 50, 96354 % 50},
		{"abc", 1, 0},
		{"polygenelubricants", 50, 0},
		{"chaos-fenced-x", 1, 0},
	} {
		if got := groupPartition(c.group, c.parts); got != c.want {
			t.Errorf("groupPartition(%q, %d) = %d, want %d", c.group, c.parts, got, c.want)
		}
	}
	// A hash that overflows to a negative number still lands in range.
	if got := groupPartition("aaaaaaaaaaaaaaaa", 50); got < 0 || got >= 50 {
		t.Errorf("groupPartition of a negative hash = %d, want in [0, 50)", got)
	}
}
