// Command mutants runs Baton's mutants (internal/testkit/mutants): it copies the module to a
// scratch directory once per worker and first runs each package's guards on the unpatched
// code: a guard that fails or is skipped there makes every mutant it guards broken (it would
// fail, or pass, for a reason no patch brought). Then, for each mutant, it applies its patch,
// builds the test binary of its package, runs each guard alone (a subtest guard Test/sub by
// the pattern ^Test$/^sub$) with a timeout, requires each to fail, and its own output (from
// its === RUN to its --- FAIL, subtests included) to match the mutant's Want, then reverts the
// patch. A guard of a mutant whose bug is not a stall (Liveness unset) that fails only by
// timing out a wait ("timed out waiting ...") did not kill it: SURVIVED (timeout). A guard
// that runs out of time did not kill its mutant either. It prints one line per mutant
// (killed, SURVIVED or BROKEN, with its seconds), for a killed one each guard's first failure
// message, and a summary, and exits 1 if any mutant survived or is broken: a patch that no
// longer applies or builds is a broken mutant.
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
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
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
	// Each package's guards run once on the unpatched code (by the first worker to reach one
	// of its mutants) before any of its mutants counts.
	baselines := map[string]*baseline{}
	for _, m := range todo {
		b := baselines[m.Package]
		if b == nil {
			b = &baseline{pkg: m.Package}
			baselines[m.Package] = b
		}
		for _, g := range m.Guards {
			if !slices.Contains(b.names, g) {
				b.names = append(b.names, g)
			}
		}
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
				results <- w.run(m, baselines[m.Package])
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
		if r.verdict == killed {
			for _, g := range r.guards {
				fmt.Printf("\t%s (%.1fs)%s\n", g.name, g.took.Seconds(), g.first())
			}
		}
		if r.verdict != killed && (*verbose || r.verdict == broken) && r.out != "" {
			fmt.Println(tail(r.out, 40))
		}
	}
	for _, pkg := range slices.Sorted(maps.Keys(baselines)) {
		if b := baselines[pkg]; b.took > 0 {
			fmt.Printf("baseline %-22s %d guards on the unpatched code in %.1fs\n", pkg, len(b.names), b.took.Seconds())
		}
	}
	fmt.Printf("mutants: %d killed, %d survived, %d broken of %d (group %s) in %.0fs\n",
		counts[killed], counts[survived]+counts[survivedTimeout], counts[broken], len(todo), *group, time.Since(start).Seconds())
	if counts[killed] != len(todo) {
		os.Exit(1)
	}
}

const (
	killed   = "killed"
	survived = "SURVIVED"
	broken   = "BROKEN"
	// survivedTimeout: a guard of a mutant whose bug is not a stall failed only by timing
	// out a liveness wait, which any slowness could cause.
	survivedTimeout = "SURVIVED (timeout)"
)

// baseline is a package's guards run on the unpatched code.
type baseline struct {
	pkg    string
	names  []string // the guards of the package's mutants to run
	once   sync.Once
	err    string              // the package could not be set up or built
	guards map[string]guardRun // each guard's run
	took   time.Duration
}

type result struct {
	m           mutants.Mutant
	verdict     string
	why         string
	build, test time.Duration
	out         string
	guards      []guardRun // each guard's run, in the order of the mutant's Guards
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

func (w *worker) setUp() error {
	if !w.copied {
		w.copied = true
		w.dir, w.copyErr = os.MkdirTemp("", "baton-mutants-")
		if w.copyErr == nil {
			w.copyErr = mutants.Copy(w.root, w.dir)
		}
	}
	return w.copyErr
}

// build builds the test binary of pkg in the worker's copy as it is now. -trimpath keeps the
// copy's temporary directory out of the build: the packages a patch does not touch are the
// build cache's entries of every earlier run (and of the other workers), not new ones each
// run, so the cache does not grow by a copy of the module per run.
func (w *worker) build(pkg string) (string, string, error) {
	bin := filepath.Join(w.dir, ".mutants", strings.ReplaceAll(pkg, "/", "_")+".test")
	cmd := exec.Command("go", "test", "-c", "-trimpath", "-vet=off", "-o", bin, "./"+pkg)
	cmd.Dir = w.dir
	out, err := cmd.CombinedOutput()
	return bin, string(out), err
}

// baseline runs the guards of pkg's mutants once on the unpatched code, in the worker's copy:
// a guard that fails or is skipped there would fail (or pass) for a reason no patch brought.
func (w *worker) baseline(b *baseline) {
	b.once.Do(func() {
		b.guards = map[string]guardRun{}
		t0 := time.Now()
		defer func() { b.took = time.Since(t0) }()
		if err := w.setUp(); err != nil {
			b.err = "copying the module: " + err.Error()
			return
		}
		if w.failed {
			b.err = "an earlier patch of this copy could not be reverted"
			return
		}
		bin, out, err := w.build(b.pkg)
		if err != nil {
			b.err = "the unpatched package does not build\n" + out
			return
		}
		for _, g := range b.names {
			b.guards[g] = w.guard(bin, b.pkg, g)
		}
	})
}

func (w *worker) run(m mutants.Mutant, b *baseline) (r result) {
	r.m = m
	if err := w.setUp(); err != nil {
		r.verdict, r.why = broken, "copying the module: "+err.Error()
		return r
	}
	w.baseline(b)
	if b.err != "" {
		r.verdict, r.why, r.out = broken, "baseline: "+firstLine(b.err), b.err
		return r
	}
	for _, g := range m.Guards {
		if gr := b.guards[g]; gr.status != statusPass {
			r.verdict, r.why, r.out = broken, fmt.Sprintf("guard %s %s on the unpatched code%s", g, gr.status, gr.first()), gr.block
			return r
		}
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
	t0 := time.Now()
	bin, out, err := w.build(m.Package)
	r.build = time.Since(t0)
	if err != nil {
		r.verdict, r.why, r.out = broken, "the patched package does not build", out
		return r
	}
	var want *regexp.Regexp
	if m.Want != "" {
		want = regexp.MustCompile(m.Want)
	}
	for _, g := range m.Guards {
		gr := w.guard(bin, m.Package, g).without(b.guards[g])
		r.test += gr.took
		r.guards = append(r.guards, gr)
		r.out += gr.out
		why := ""
		switch {
		case gr.status == statusFail && !m.Liveness && gr.timeoutOnly():
			r.verdict = survivedTimeout
			why = fmt.Sprintf("%s failed only by timing out a wait%s", g, gr.first())
		case gr.status == statusFail && want != nil && !want.MatchString(gr.block):
			why = fmt.Sprintf("%s failed, but not with %q%s", g, m.Want, gr.first())
		case gr.status == statusFail:
			continue
		case gr.status == statusTimeout:
			why = fmt.Sprintf("%s ran out of time (%v) instead of failing", g, w.timeout)
		case gr.status == statusMissing:
			r.verdict, r.why = broken, g+" did not run: "+firstLine(gr.out)
			return r
		default:
			why = g + " " + gr.status
		}
		if r.verdict == "" {
			r.verdict = survived
		}
		r.why = why
		return r
	}
	r.verdict = killed
	return r
}

// The outcomes of one guard's run.
const (
	statusPass    = "passed"
	statusFail    = "failed"
	statusSkip    = "was skipped"
	statusSubSkip = "had a subtest skipped"
	statusTimeout = "ran out of time"
	statusMissing = "did not run"
)

// guardRun is one guard's run: its status, its own output and its failure messages.
type guardRun struct {
	name     string
	status   string
	out      string   // the binary's whole output
	block    string   // the guard's own output: from its === RUN to its --- FAIL (subtests included)
	failures []string // the t.Error / t.Fatal messages in block (the text after file.go:line:)
	shapes   []string // each failure's file.go:line: text, its numbers replaced by #
	took     time.Duration
}

func (g guardRun) first() string {
	if len(g.failures) == 0 {
		return ""
	}
	return ": " + g.failures[0]
}

// without drops the messages that the guard's passing run on the unpatched code (base) also
// printed: a t.Log through a helper, not a failure.
func (g guardRun) without(base guardRun) guardRun {
	var failures, shapes []string
	for i, f := range g.failures {
		if !slices.Contains(base.shapes, g.shapes[i]) {
			failures, shapes = append(failures, f), append(shapes, g.shapes[i])
		}
	}
	g.failures, g.shapes = failures, shapes
	return g
}

// timeoutOnly reports whether the guard's only failure is a liveness wait that ran out: a stall,
// not the cause the guard asserts.
func (g guardRun) timeoutOnly() bool {
	if len(g.failures) == 0 {
		return false
	}
	for _, f := range g.failures {
		if !timedOut.MatchString(f) {
			return false
		}
	}
	return true
}

var (
	timedOut = regexp.MustCompile(`^timed out (after \S+ )?waiting`)
	message  = regexp.MustCompile(`^\s+([\w.-]+\.go):(\d+): (.*)$`)
	logCall  = regexp.MustCompile(`\.Logf?\(`)
	number   = regexp.MustCompile(`[0-9][0-9.]*(ns|µs|ms|s|m|h)?`)
	panicked = regexp.MustCompile(`(?m)^panic: (.*)$`)
)

// runPattern is -test.run's pattern for the guard: each level of Test/sub anchored.
func runPattern(g string) string {
	parts := strings.Split(g, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// guard runs one guard alone from the test binary bin.
func (w *worker) guard(bin, pkg, g string) (gr guardRun) {
	gr.name = g
	// The guard's own timeout ends it with a panic naming the test; the context is the
	// backstop for a binary that does not end then.
	ctx, cancel := context.WithTimeout(context.Background(), w.timeout+30*time.Second)
	defer cancel()
	t0 := time.Now()
	cmd := exec.CommandContext(ctx, bin, "-test.run="+runPattern(g), "-test.count=1", "-test.v",
		"-test.timeout="+w.timeout.String())
	cmd.Dir = filepath.Join(w.dir, pkg)
	cmd.Env = append(os.Environ(), "BATON_TEST_BOUND="+w.bound)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	gr.took = time.Since(t0)
	gr.out = buf.String()
	q := regexp.QuoteMeta(g)
	has := func(verdict string) bool {
		return regexp.MustCompile(`(?m)^\s*--- ` + verdict + `: ` + q + ` \(`).MatchString(gr.out)
	}
	switch {
	case ctx.Err() != nil || strings.Contains(gr.out, "panic: test timed out"):
		gr.status = statusTimeout
	case has("FAIL"):
		gr.status = statusFail
	case has("SKIP"):
		gr.status = statusSkip
	case has("PASS") && err == nil:
		gr.status = statusPass
	default:
		gr.status = statusMissing
	}
	gr.block = gr.out
	lines := strings.Split(gr.out, "\n")
	start, end := -1, len(lines)
	for i, l := range lines {
		if start < 0 && l == "=== RUN   "+g {
			start = i
		}
		if start >= 0 && regexp.MustCompile(`^\s*--- (FAIL|SKIP|PASS): `+q+` \(`).MatchString(l) {
			// Its subtests' results follow it, indented.
			for end = i + 1; end < len(lines) && strings.HasPrefix(lines[end], "    "); end++ {
			}
			break
		}
	}
	if start >= 0 {
		gr.block = strings.Join(lines[start:end], "\n")
		for _, l := range lines[start:end] {
			if sm := message.FindStringSubmatch(l); sm != nil && !w.logged(pkg, sm[1], sm[2]) {
				gr.failures = append(gr.failures, sm[3])
				gr.shapes = append(gr.shapes, sm[1]+":"+sm[2]+": "+number.ReplaceAllString(sm[3], "#"))
			}
		}
	}
	if gr.status == statusPass && strings.Contains(gr.block, "--- SKIP: ") {
		// Part of the guard did not run (a service it needs is not configured?): on the
		// unpatched code that is no baseline, and under a patch no kill.
		gr.status = statusSubSkip
	}
	if gr.status == statusFail && len(gr.failures) == 0 {
		if sm := panicked.FindStringSubmatch(gr.out); sm != nil {
			gr.failures = append(gr.failures, "panic: "+sm[1])
		}
	}
	return gr
}

// logged reports whether line of the package's file is a t.Log call: its message is no failure.
func (w *worker) logged(pkg, file, line string) bool {
	n, err := strconv.Atoi(line)
	if err != nil {
		return false
	}
	b, err := os.ReadFile(filepath.Join(w.dir, pkg, file))
	if err != nil {
		return false
	}
	lines := strings.Split(string(b), "\n")
	return n >= 1 && n <= len(lines) && logCall.MatchString(lines[n-1])
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return l
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return "\t" + strings.Join(lines[max(0, len(lines)-n):], "\n\t")
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "mutants: "+format+"\n", args...)
	os.Exit(2)
}
