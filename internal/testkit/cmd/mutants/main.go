// Command mutants runs Baton's mutants (internal/testkit/mutants): it copies the module to a
// scratch directory once per worker and, for each mutant, applies its patch, builds the test
// binary of its package, runs the guards with a per-mutant timeout and requires each guard to
// fail (and the output to match the mutant's Want), then reverts the patch. It prints one line
// per mutant (killed, SURVIVED or BROKEN, with its seconds) and a summary, and exits 1 if any
// mutant survived or is broken: a patch that no longer applies or builds is a broken mutant,
// and a guard that fails only by running out of time did not kill its mutant.
//
//	go run ./internal/testkit/cmd/mutants                 # every mutant ('make mutants')
//	go run ./internal/testkit/cmd/mutants -group safety   # the safety-critical ones ('make mutants-safety')
//	go run ./internal/testkit/cmd/mutants -run 'Relay'    # those whose name matches
//
// Test plumbing only: nothing imports it.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/batonhq/baton/internal/testkit/mutants"
)

func main() {
	group := flag.String("group", "all", "the mutants to run: all, or a group (safety, full)")
	run := flag.String("run", "", "run only the mutants whose name matches this regular expression")
	jobs := flag.Int("j", min(2, runtime.NumCPU()), "mutants run at once, each in its own copy of the module")
	timeout := flag.Duration("timeout", 60*time.Second, "the bound of one mutant's guard run (its build not included)")
	testBound := flag.String("bound", "15s", "BATON_TEST_BOUND for the guards: the cap on their liveness waits")
	verbose := flag.Bool("v", false, "print the guards' output of every mutant not killed")
	flag.Parse()

	var todo []mutants.Mutant
	re, err := regexp.Compile(*run)
	if err != nil {
		fatalf("-run: %v", err)
	}
	for _, m := range mutants.All {
		if (*group == "all" || m.Group == *group) && re.MatchString(m.Name) {
			todo = append(todo, m)
		}
	}
	if len(todo) == 0 {
		fatalf("no mutant in group %q matches %q", *group, *run)
	}
	// Grouped by package: a worker runs a package's mutants one after another, so the
	// packages they do not patch stay built in its copy.
	slices.SortStableFunc(todo, func(a, b mutants.Mutant) int { return strings.Compare(a.Package, b.Package) })

	root, err := mutants.ModuleRoot(".")
	if err != nil {
		fatalf("%v", err)
	}
	start := time.Now()
	queue := make(chan mutants.Mutant)
	results := make(chan result)
	var wg sync.WaitGroup
	for range min(*jobs, len(todo)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := &worker{root: root, timeout: *timeout, bound: *testBound}
			defer w.close()
			for m := range queue {
				results <- w.run(m)
			}
		}()
	}
	go func() {
		for _, m := range todo {
			queue <- m
		}
		close(queue)
		wg.Wait()
		close(results)
	}()
	counts := map[string]int{}
	for r := range results {
		counts[r.verdict]++
		fmt.Printf("%-8s %-22s %-36s %6.1fs (build %.1fs, guards %.1fs)%s\n", r.verdict, r.m.Package, r.m.Name,
			(r.build + r.test).Seconds(), r.build.Seconds(), r.test.Seconds(), r.note())
		if r.verdict != killed && (*verbose || r.verdict == broken) && r.out != "" {
			fmt.Println(tail(r.out, 40))
		}
	}
	fmt.Printf("mutants: %d killed, %d survived, %d broken of %d (group %s) in %.0fs\n",
		counts[killed], counts[survived], counts[broken], len(todo), *group, time.Since(start).Seconds())
	if counts[killed] != len(todo) {
		os.Exit(1)
	}
}

const (
	killed   = "killed"
	survived = "SURVIVED"
	broken   = "BROKEN"
)

type result struct {
	m           mutants.Mutant
	verdict     string
	why         string
	build, test time.Duration
	out         string
}

func (r result) note() string {
	if r.why == "" {
		return ""
	}
	return ": " + r.why
}

// worker runs mutants in its own copy of the module.
type worker struct {
	root, dir      string
	timeout        time.Duration
	bound          string
	copyErr        error
	copied, failed bool
}

func (w *worker) close() {
	if w.dir != "" {
		os.RemoveAll(w.dir)
	}
}

func (w *worker) run(m mutants.Mutant) (r result) {
	r.m = m
	if !w.copied {
		w.copied = true
		w.dir, w.copyErr = os.MkdirTemp("", "baton-mutants-")
		if w.copyErr == nil {
			w.copyErr = mutants.Copy(w.root, w.dir)
		}
	}
	if w.copyErr != nil {
		r.verdict, r.why = broken, "copying the module: "+w.copyErr.Error()
		return r
	}
	if w.failed {
		r.verdict, r.why = broken, "an earlier patch of this copy could not be reverted"
		return r
	}
	if err := m.Apply(w.dir); err != nil {
		r.verdict, r.why, r.out = broken, "the patch does not apply", err.Error()
		return r
	}
	defer func() {
		if err := m.Revert(w.dir); err != nil {
			w.failed = true
			r.verdict, r.why, r.out = broken, "the patch does not revert", err.Error()
		}
	}()
	bin := filepath.Join(w.dir, ".mutants", strings.ReplaceAll(m.Package, "/", "_")+".test")
	t0 := time.Now()
	build := exec.Command("go", "test", "-c", "-vet=off", "-o", bin, "./"+m.Package)
	build.Dir = w.dir
	out, err := build.CombinedOutput()
	r.build = time.Since(t0)
	if err != nil {
		r.verdict, r.why, r.out = broken, "the patched package does not build", string(out)
		return r
	}
	var top []string
	for _, g := range m.Guards {
		name, _, _ := strings.Cut(g, "/")
		if !slices.Contains(top, name) {
			top = append(top, name)
		}
	}
	// The guards' own timeout ends them with a panic naming the test; the context is the
	// backstop for a binary that does not end then.
	ctx, cancel := context.WithTimeout(context.Background(), w.timeout+30*time.Second)
	defer cancel()
	t0 = time.Now()
	cmd := exec.CommandContext(ctx, bin, "-test.run=^("+strings.Join(top, "|")+")$", "-test.count=1", "-test.v",
		"-test.timeout="+w.timeout.String())
	cmd.Dir = filepath.Join(w.dir, m.Package)
	cmd.Env = append(os.Environ(), "BATON_TEST_BOUND="+w.bound)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err = cmd.Run()
	r.test = time.Since(t0)
	r.out = buf.String()
	switch {
	case err == nil:
		r.verdict, r.why = survived, "every guard passed"
		if skips := regexp.MustCompile(`--- SKIP: (\S+)`).FindAllStringSubmatch(r.out, -1); len(skips) > 0 {
			var names []string
			for _, s := range skips {
				names = append(names, s[1])
			}
			r.why += " (skipped: " + strings.Join(names, ", ") + ": a service they need is not configured?)"
		}
		return r
	case ctx.Err() != nil || strings.Contains(r.out, "panic: test timed out"):
		r.verdict, r.why = survived, fmt.Sprintf("the guards ran out of time (%v) instead of failing", w.timeout)
		return r
	}
	for _, g := range m.Guards {
		if !strings.Contains(r.out, "--- FAIL: "+g+" (") {
			r.verdict, r.why = survived, g+" did not fail"
			return r
		}
	}
	if m.Want != "" && !regexp.MustCompile(m.Want).MatchString(r.out) {
		r.verdict, r.why = survived, fmt.Sprintf("the guards failed, but not with %q", m.Want)
		return r
	}
	r.verdict = killed
	return r
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return "\t" + strings.Join(lines[max(0, len(lines)-n):], "\n\t")
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "mutants: "+format+"\n", args...)
	os.Exit(2)
}
