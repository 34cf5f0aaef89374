package sqlitefence

import (
	"testing"

	"go.uber.org/goleak"
)

// database/sql starts a connection-opener goroutine per *sql.DB: every test must close every
// database it opens, and goleak proves it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
