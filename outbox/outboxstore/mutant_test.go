package outboxstore

import (
	"testing"
	"time"

	"github.com/batonhq/baton/outbox/internal/mutant"
	"github.com/batonhq/baton/outbox/internal/mutanttest"
)

func init() { mutanttest.Init() }

// TestMutants requires outboxstore's named mutant (outbox/internal/mutant) to be caught.
func TestMutants(t *testing.T) {
	mutanttest.Run(t, map[string][]string{
		mutant.AppendUnvalidated: {"TestValidateAppend"},
	}, time.Minute)
}
