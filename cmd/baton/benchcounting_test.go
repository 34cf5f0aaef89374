package main

import (
	"testing"

	"github.com/batonhq/baton/cmd/baton/internal/bench"
	"github.com/batonhq/baton/fence"
	"github.com/jackc/pgx/v5"
)

// withTopics is a sink that keeps topic identities (its methods are never called here).
type withTopics struct {
	fence.Sink[pgx.Tx]
	fence.Topics
}

func TestCountingKeepsTopics(t *testing.T) {
	rec := bench.NewRecorder(1)
	if _, ok := counting[pgx.Tx](withTopics{}, rec).(fence.Topics); !ok {
		t.Error("the counted sink hides the fence.Topics of the sink it counts")
	}
	if _, ok := counting[pgx.Tx](unfencedSink{}, rec).(fence.Topics); ok {
		t.Error("the counted unfenced sink claims to keep topic identities")
	}
}
