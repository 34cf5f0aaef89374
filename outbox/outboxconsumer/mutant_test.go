package outboxconsumer_test

import (
	"testing"
	"time"

	"github.com/batonhq/baton/outbox/internal/mutant"
	"github.com/batonhq/baton/outbox/internal/mutanttest"
)

func init() { mutanttest.Init() }

// TestMutants requires outboxconsumer's named mutants (outbox/internal/mutant) to be caught.
// DeadLetterDirect's killer needs PostgreSQL: without it (never in CI, where a missing service
// fails) the killer skips, and so does the mutant's run.
func TestMutants(t *testing.T) {
	mutanttest.Run(t, map[string][]string{
		mutant.DeadLetterDirect:        {"TestZombieDeadLetterThroughTheOutbox"},
		mutant.InboxPreparedUnfiltered: {"TestInboxKeepsPreparedAligned"},
		mutant.ShardCountUnchecked:     {"TestPrepareShardsChecksTheShardCount"},
	}, 3*time.Minute)
}
