package pgfence

import (
	"testing"

	"go.uber.org/goleak"
)

// pgxpool runs background goroutines per pool and the race test runs a writer goroutine:
// every test must close what it opens and wait for what it starts, and goleak proves it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
