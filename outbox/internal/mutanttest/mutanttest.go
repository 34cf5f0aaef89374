// Package mutanttest runs a package's tests against the outbox runtime's named mutants
// (outbox/internal/mutant) and requires each mutant to be killed.
package mutanttest

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/outbox/internal/mutant"
)

// Init builds the mutant named in $BATON_OUTBOX_MUTANT; call it from the test package's
// TestMain (or an init function in a _test.go file).
func Init() { mutant.Set(os.Getenv(mutant.Env)) }

// Run runs, for each mutant in kills, the named top-level tests of this test binary in a child
// process built with that mutant, and requires each of them to fail within bound. It logs the
// kill rate.
func Run(t *testing.T, kills map[string][]string, bound time.Duration) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts child processes")
	}
	if os.Getenv(mutant.Env) != "" {
		t.Skip("in a mutant's child process")
	}
	killed, skipped := 0, 0
	for name, tests := range kills {
		ok := t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), bound)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^("+strings.Join(tests, "|")+")$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), mutant.Env+"="+name)
			out, err := cmd.CombinedOutput()
			if ctx.Err() != nil {
				t.Fatalf("the tests hung on the mutant %s instead of failing within %v", name, bound)
			}
			if err == nil {
				// A killer that skipped (or whose subtests did) did not run: locally a missing
				// service skips it (internal/testenv), and then the mutant is not exercised
				// either; in CI a missing service fails it instead, so CI never skips here.
				for _, c := range tests {
					if regexp.MustCompile(`--- SKIP: ` + regexp.QuoteMeta(c) + `[ /]`).MatchString(string(out)) {
						skipped++
						t.Skipf("%s skipped in the child (a service it needs is not configured): the mutant %s was not exercised", c, name)
					}
				}
				t.Fatalf("the tests passed against the mutant %s", name)
			}
			failed := map[string]bool{}
			for _, m := range regexp.MustCompile(`--- FAIL: (\w+)`).FindAllStringSubmatch(string(out), -1) {
				failed[m[1]] = true
			}
			for _, c := range tests {
				if !failed[c] {
					t.Errorf("%s did not catch %s", c, name)
				}
			}
			if t.Failed() {
				lines := strings.Split(string(out), "\n")
				t.Logf("child output:\n%s", strings.Join(lines[max(0, len(lines)-40):], "\n"))
			}
		})
		if ok {
			killed++
		}
	}
	t.Logf("mutants killed: %d of %d (%d not exercised: a killer skipped)", killed-skipped, len(kills), skipped)
}
