package status_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/internal/operator/status"
)

// TestSQLiteStoreKafkaDown: with the brokers unreachable, status still shows the fences an
// SQLite store holds and names Kafka as unreachable; recover is refused (it cannot check for a
// live owner) unless forced, and the forced recovery is recorded and listed.
func TestSQLiteStoreKafkaDown(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "f.db")
	st, err := sqlitefence.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	k := fence.Key{Group: "g", Topic: "t", Partition: 2}
	if _, err := st.Claim(ctx, k, fence.Token{Epoch: 7}, "test"); err != nil {
		t.Fatal(err)
	}
	c, err := status.NewCollector(status.Config{Brokers: []string{"127.0.0.1:1"}, Store: path, Group: "g", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	snap, err := c.Collect(ctx)
	if !errors.Is(err, status.ErrUnreachable) || !strings.Contains(err.Error(), "Kafka at 127.0.0.1:1") {
		t.Errorf("Collect: err = %v, want Kafka named unreachable", err)
	}
	if l := snap.Partition("t", 2); l == nil || l.Token != "0.7" || l.Position == nil || *l.Position != fence.NoPosition || l.Owner != nil || l.Lag != nil {
		t.Fatalf("partition line = %+v, want the stored fence 0.7 with no owner and unknown lag", l)
	}
	if snap.Sources[0].Err == "" || snap.Sources[1].Err != "" {
		t.Errorf("sources = %+v, want kafka failed and the store read", snap.Sources)
	}

	req := status.RecoverRequest{Topic: "t", Reason: "group deleted", Claimant: "operator:test@host"}
	if _, err := c.Recover(ctx, req); !errors.Is(err, status.ErrUnreachable) {
		t.Fatalf("Recover with Kafka down: err = %v, want ErrUnreachable", err)
	}
	if s, _ := st.Load(ctx, k); s.Token != (fence.Token{Epoch: 7}) {
		t.Fatalf("a refused recover changed the fence to %v", s.Token)
	}
	req.Force = true
	done, err := c.Recover(ctx, req)
	if err != nil || len(done) != 1 || done[0].From != "0.7" || done[0].To != "1.0" {
		t.Fatalf("forced Recover = %+v, %v; want 0.7 -> 1.0", done, err)
	}
	recs, err := st.Recoveries(ctx, k)
	if err != nil || len(recs) != 1 || recs[0].Reason != "group deleted (by operator:test@host)" {
		t.Fatalf("recorded recoveries = %+v, %v", recs, err)
	}
	// A second forced recover moves on from 1.0: each is a compare-and-set from the stored token.
	if done, err := c.Recover(ctx, req); err != nil || done[0].To != "2.0" {
		t.Fatalf("second Recover = %+v, %v; want -> 2.0", done, err)
	}
	snap, _ = c.Collect(ctx)
	if len(snap.Recoveries) != 2 || snap.Summary.Recoveries != 2 || snap.Partition("t", 2).LastRecovery.To != "2.0" {
		t.Errorf("snapshot recoveries = %+v, summary %+v", snap.Recoveries, snap.Summary)
	}
	if _, err := c.Recover(ctx, status.RecoverRequest{Topic: "t", Partitions: []int32{5}, Reason: "r", Force: true}); !errors.Is(err, status.ErrNotFound) {
		t.Errorf("Recover of a partition without a fence row: err = %v, want ErrNotFound", err)
	}
}
