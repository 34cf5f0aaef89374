package leasetest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/lease"
	"github.com/batonhq/baton/internal/testkit/leasetest"
)

// The suite's own tests run it against fileSource, a small lease service in a directory
// shared by the helper processes, and against broken variants of it (mutants) that the suite
// must catch.
const (
	envDir    = "LEASETEST_FILESOURCE_DIR"
	envMutant = "LEASETEST_MUTANT"
	group     = "lease:file"
	fileTTL   = time.Second
)

func TestMain(m *testing.M) {
	if leasetest.IsChild() {
		os.Exit(leasetest.Child(leasetest.Config{NewSource: func(context.Context) (lease.Source, func(), error) {
			return &fileSource{dir: os.Getenv(envDir), mutant: os.Getenv(envMutant)}, func() {}, nil
		}}))
	}
	goleak.VerifyTestMain(m)
}

// fileSource grants a resource to whoever creates its holder file; the holder touches the file
// every TTL/4 and a file untouched for the TTL is expired and may be taken over. The counter
// file, written only by the holder, gives the tokens. Mutants: "stuck-token" issues the same
// token to every holder; "silent" never reports a loss.
type fileSource struct {
	dir    string
	mutant string
}

func (f *fileSource) Acquire(ctx context.Context, resource string) (*lease.Lease, error) {
	holder := filepath.Join(f.dir, resource+".holder")
	id := fmt.Sprintf("%s#%d-%d", holder, os.Getpid(), time.Now().UnixNano())
	for {
		h, err := os.OpenFile(holder, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err == nil {
			_, err = h.WriteString(id)
			if cerr := h.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return nil, err
			}
			break
		}
		if st, serr := os.Stat(holder); serr == nil && time.Since(st.ModTime()) > fileTTL {
			_ = os.Remove(holder) // expired
			continue
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	counter := filepath.Join(f.dir, resource+".counter")
	b, _ := os.ReadFile(counter)
	n, _ := strconv.ParseInt(string(b), 10, 64)
	n++
	if f.mutant == "stuck-token" {
		n = 1
	}
	if err := os.WriteFile(counter, []byte(strconv.FormatInt(n, 10)), 0o644); err != nil {
		return nil, err
	}
	ours := func() bool { b, err := os.ReadFile(holder); return err == nil && string(b) == id }
	stop, done := make(chan struct{}), make(chan struct{})
	var stopOnce sync.Once
	l, lost, err := lease.Grant(lease.Key(group, resource), fence.Token{Epoch: n}, id, func(context.Context) error {
		stopOnce.Do(func() { close(stop) })
		<-done
		if ours() {
			return os.Remove(holder)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	go func() {
		defer close(done)
		t := time.NewTicker(fileTTL / 4)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			if !ours() {
				if f.mutant != "silent" {
					lost(errors.New("holder file taken over or removed"))
				}
				return
			}
			now := time.Now()
			_ = os.Chtimes(holder, now, now)
		}
	}()
	return l, nil
}

// kill removes a holder's file: the service ending the grant.
func kill(_ context.Context, id string) error {
	path, _, _ := strings.Cut(id, "#")
	return os.Remove(path)
}

func runSuite(t *testing.T) {
	t.Run("Zombie", func(t *testing.T) {
		t.Setenv(envDir, t.TempDir())
		leasetest.Zombie(t, group)
	})
	t.Run("InFlight", func(t *testing.T) {
		t.Setenv(envDir, t.TempDir())
		leasetest.InFlight(t, group, kill)
	})
}

// TestSuite: the working file source passes.
func TestSuite(t *testing.T) {
	t.Setenv(envMutant, "")
	runSuite(t)
}

// mutants are broken sources, each with the cases that must catch it.
var mutants = map[string][]string{
	"stuck-token": {"Zombie", "InFlight"}, // a successor's token is not higher
	"silent":      {"Zombie", "InFlight"}, // a lost lease is never reported
}

// TestMutant runs the suite against the mutant named by $LEASETEST_MUTANT; it is the child
// process of TestMutants and is skipped otherwise.
func TestMutant(t *testing.T) {
	if os.Getenv(envMutant) == "" {
		t.Skip("run by TestMutants")
	}
	runSuite(t)
}

// TestMutants proves each case can fail: every mutant must make the cases it names fail.
func TestMutants(t *testing.T) {
	for name, want := range mutants {
		t.Run(name, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestMutant$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), envMutant+"="+name, "BATON_LEASETEST_OP_TIMEOUT=3s", "BATON_POSTGRES_URL=")
			out, _ := cmd.CombinedOutput()
			failed := map[string]bool{}
			for _, m := range regexp.MustCompile(`--- FAIL: TestMutant/(\w+)`).FindAllStringSubmatch(string(out), -1) {
				failed[m[1]] = true
			}
			for _, c := range want {
				if !failed[c] {
					t.Errorf("mutant %s: case %s did not fail\n%s", name, c, tail(string(out), 40))
				}
			}
		})
	}
}

func tail(s string, n int) string {
	l := strings.Split(s, "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
