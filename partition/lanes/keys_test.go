package lanes

import (
	"fmt"
	"math/rand/v2"
)

// randomKeys returns n distinct random keys from a fixed seed, so measurements repeat.
func randomKeys(n int, seed uint64) [][]byte {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "user-%d-%016x", i, rng.Uint64())
	}
	return keys
}
