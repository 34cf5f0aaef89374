package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/cmd/baton/internal/bench"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/internal/readme"
)

// The baton design's check reads what the README's handler writes: it passes on the job's
// records applied once each, in order, and fails on a record lost or applied twice, or on a
// key whose last record was applied before an earlier one.
func TestReadmeDesignCheck(t *testing.T) {
	const keys, perKey = 4, 5
	ctx := context.Background()
	apply := func(name string, recs []*kgo.Record) string {
		path := filepath.Join(t.TempDir(), name+".db")
		s, err := sqlitefence.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		tx, err := s.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := readme.ApplyTwinUpdates(ctx, tx, recs); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		return path
	}
	recs := bench.Records(keys, perKey)
	if err := bench.CheckTwins(ctx, apply("exact", recs), keys, perKey); err != nil {
		t.Fatalf("the records applied once each, in order: %v", err)
	}
	last := len(recs) - 1
	swapped := append(append(append([]*kgo.Record{}, recs[:last-keys]...), recs[last]), recs[last-keys+1:last]...)
	swapped = append(swapped, recs[last-keys])
	for name, wrong := range map[string][]*kgo.Record{
		"lost":      recs[1:],
		"twice":     append(append([]*kgo.Record{}, recs...), recs[0]),
		"reordered": swapped,
	} {
		err := bench.CheckTwins(ctx, apply(name, wrong), keys, perKey)
		if err == nil || !strings.Contains(err.Error(), "check:") {
			t.Errorf("%s: CheckTwins = %v, want the check to fail", name, err)
		}
	}
}
