package chaos_test

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	mainWorker() // a worker process the example's harness started
	os.Exit(m.Run())
}
