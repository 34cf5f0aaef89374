//go:build batonmutant

package outbox

import "os"

// A build with the batonmutant tag runs as the named mutant in BATON_OUTBOX_MUTANT (see
// mutant.go). No default build compiles this file.
func init() { mutant = os.Getenv("BATON_OUTBOX_MUTANT") }
