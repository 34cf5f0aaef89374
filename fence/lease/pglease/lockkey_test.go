package pglease

import (
	"hash/fnv"
	"testing"
)

// TestLockKeyIsTheDocumentedHash pins the advisory lock key the package doc tells operators to
// look for in pg_locks.
func TestLockKeyIsTheDocumentedHash(t *testing.T) {
	h := fnv.New64a()
	h.Write([]byte("baton/pglease/lease:postgres\x00nightly-report"))
	if got, want := lockKey("lease:postgres", "nightly-report"), int64(h.Sum64()); got != want {
		t.Fatalf("lockKey = %d, want %d (FNV-1a of the documented string)", got, want)
	}
}
