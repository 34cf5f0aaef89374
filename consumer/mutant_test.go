package consumer

import "os"

// The mutation tests (TestMutants in consumer_test) run this binary with the mutant to build
// in BATON_CONSUMER_MUTANT.
func init() { mutant = os.Getenv("BATON_CONSUMER_MUTANT") }
