package audit_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/operator/audit"
)

// Recoveries made while passes read the store are no violation: a recovery moves its fence and
// records itself in one transaction, and a pass reads the recoveries before the fences (and
// again for an era it did not find among them), so it never sees a fence below a recovery it
// read, nor a recovered era without its record. Recoveries run back to back beside the passes
// until enough of them overlapped the passes: without either half of that order the race shows
// within the first ten passes.
func TestRecoveriesDuringPassesAreNoViolation(t *testing.T) {
	const enough = 50
	both(t, func(t *testing.T, e *env) {
		e.produce(t, 1)
		e.claim(t, tok5)
		st, ok := e.topics.(interface {
			Recover(ctx context.Context, k fence.Key, expected fence.Token, epoch int64, claimant, reason string) (fence.Token, error)
		})
		if !ok {
			t.Fatalf("%T cannot recover", e.topics)
		}
		a, _ := e.auditor(t)
		ctx, cancel := context.WithCancel(context.Background())
		var (
			wg        sync.WaitGroup
			mu        sync.Mutex
			recovered int
			recErr    error
		)
		wg.Add(1)
		go func() {
			defer wg.Done()
			cur := tok5
			for ctx.Err() == nil {
				to, err := st.Recover(ctx, e.key, cur, cur.Epoch, "audit-test", "recovered while audited")
				if err != nil {
					if ctx.Err() == nil {
						mu.Lock()
						recErr = err
						mu.Unlock()
					}
					return
				}
				cur = to
				mu.Lock()
				recovered++
				mu.Unlock()
				time.Sleep(time.Millisecond) // a few recoveries per pass, not thousands of rows to read
			}
		}()
		passes, deadline := 0, time.Now().Add(20*time.Second)
		for ; time.Now().Before(deadline); passes++ {
			r := pass(t, a)
			for _, v := range r.Violations {
				if v.Check == audit.Tokens {
					cancel()
					wg.Wait()
					t.Fatalf("pass %d, with recoveries running: %s %v", passes, v.What, v.Evidence)
				}
			}
			mu.Lock()
			n := recovered
			mu.Unlock()
			if passes >= enough && n >= enough {
				break
			}
		}
		cancel()
		wg.Wait()
		if recErr != nil {
			t.Fatalf("recover: %v", recErr)
		}
		if passes < enough || recovered < enough {
			t.Fatalf("%d passes beside %d recoveries in 20s, want at least %d of each", passes, recovered, enough)
		}
		t.Logf("%d passes beside %d recoveries, no Tokens violation", passes, recovered)
	})
}
