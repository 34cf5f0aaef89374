//go:build batonmutant

package consumer

import "os"

// A build with the batonmutant tag (the chaos harness's mutant tests build cmd/baton with it,
// internal/chaos) runs as the named mutant in BATON_CONSUMER_MUTANT, so a real worker process
// can be shown to break the invariant a fix protects. No default build compiles this file:
// there the variable stays empty, whatever the environment says.
func init() { mutant = os.Getenv("BATON_CONSUMER_MUTANT") }
