//go:build batonmutant

package outbox

import (
	"os"

	"github.com/batonhq/baton/outbox/internal/mutant"
)

// A build with the batonmutant tag (the chaos harness's mutant tests build cmd/baton with it,
// internal/chaos) runs as the named mutant in BATON_OUTBOX_MUTANT (outbox/internal/mutant), so
// a real worker process can be shown to break the invariant a fix protects. No default build
// compiles this file.
func init() { mutant.Set(os.Getenv(mutant.Env)) }
