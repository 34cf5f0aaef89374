package redisfence

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test closes the clients it opens; goleak proves that no connection or waiter is left.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
