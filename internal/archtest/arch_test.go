package archtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/batonhq/baton"

type pkg struct {
	ImportPath string
	Imports    []string
}

// listPackages runs 'go list -json ./...' from the module root (without test files, so the
// rules apply to what users link).
func listPackages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", "./...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	var pkgs []pkg
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 {
		t.Fatal("go list found no packages")
	}
	return pkgs
}

func rel(path string) string {
	if path == module {
		return ""
	}
	return strings.TrimPrefix(path, module+"/")
}

func isOurs(path string) bool { return path == module || strings.HasPrefix(path, module+"/") }

func under(r, dir string) bool { return r == dir || strings.HasPrefix(r, dir+"/") }

// layers are the tree's layers, bottom up: a package may import ours only from its own layer
// or a lower one. A pattern is a folder ("fence": that package alone) or a folder and
// everything below it ("fence/..."); a package is in the layer of its exact pattern, else of
// its longest "/..." pattern.
var layers = []struct {
	what     string
	patterns []string
	sdk      bool // may import the OpenTelemetry SDK (applications; libraries use the API only)
}{
	{what: "the contract: the token and the fenced sink, standard library only", patterns: []string{"fence"}},
	{what: "helpers the library imports, and test plumbing", patterns: []string{"internal/..."}},
	{what: "the fence stores and token sources, and the token sources' test suite", patterns: []string{"fence/...", "internal/testkit/leasetest"}},
	{what: "partitions: identity, lanes, routing", patterns: []string{"partition/..."}},
	{what: "the outbox, relay, inbox and their stores: effects under a fence key and token", patterns: []string{"outbox/..."}},
	{what: "the consumer: owns partitions, may call the outbox through AfterCommit", patterns: []string{"consumer/..."}},
	{what: "the glue that needs the outbox and the consumer", patterns: []string{"outbox/outboxconsumer/..."}},
	{what: "the operator application: the chaos harness, status, timeline, telemetry wiring, the baseline lock",
		patterns: []string{"internal/operator/..."}, sdk: true},
	{what: "the chaos harness's public face, for a user's own workload", patterns: []string{"consumer/chaos/..."}},
	// The README's first program: an example (public packages only) that a command imports
	// too ('baton bench' measures its handler), so it cannot live under examples/.
	{what: "the README's first program", patterns: []string{readmeProgram}},
	{what: "programs: commands (with their own internal packages) and examples", patterns: []string{"cmd/...", "examples/..."}, sdk: true},
}

// readmeProgram is the package of the README's first program.
const readmeProgram = "internal/readme"

// layer returns the index in layers of package r (relative to the module).
func layer(r string) int {
	best, bestLen := len(layers), -1
	for i, l := range layers {
		for _, p := range l.patterns {
			dir, tree := strings.CutSuffix(p, "/...")
			switch {
			case !tree && r == dir:
				return i
			case tree && under(r, dir) && len(dir) > bestLen:
				best, bestLen = i, len(dir)
			}
		}
	}
	return best
}

// testPlumbing is what only _test.go files, and the test kit's own programs, import.
var testPlumbing = []string{"internal/testkit"}

// ownInternal reports whether ir is an internal package of the command or example r belongs to
// (cmd/baton imports cmd/baton/internal/...).
func ownInternal(r, ir string) bool {
	i := strings.Index(ir, "/internal/")
	return i > 0 && under(r, ir[:i])
}

func isProgram(r string) bool { return under(r, "cmd") || under(r, "examples") }

// checkImport returns why package r may not import ir (both relative to the module), or "".
func checkImport(r, ir string) string {
	switch {
	case isProgram(ir) && !ownInternal(r, ir):
		return "nothing imports cmd/ or examples/ (but a command its own internal packages)"
	case (under(r, "examples") || r == readmeProgram) && (under(ir, "internal") || strings.Contains(ir, "/internal/")):
		return "an example imports only public packages: a user copies it out of this module"
	case slices.ContainsFunc(testPlumbing, func(d string) bool { return under(ir, d) && !under(r, d) }):
		return "test plumbing is for _test.go files only"
	case layer(ir) > layer(r):
		return fmt.Sprintf("%s (layer %d) imports %s (layer %d): imports must point down",
			r, layer(r), ir, layer(ir))
	}
	return ""
}

func TestImportDirection(t *testing.T) {
	for _, p := range listPackages(t) {
		r := rel(p.ImportPath)
		for _, imp := range p.Imports {
			if isOurs(imp) {
				if why := checkImport(r, rel(imp)); why != "" {
					t.Errorf("%s imports %s: %s", r, rel(imp), why)
				}
			}
			if !layers[layer(r)].sdk && strings.HasPrefix(imp, "go.opentelemetry.io/otel/sdk") {
				t.Errorf("%s imports %s: a library uses the OpenTelemetry API only; the SDK is for applications", r, imp)
			}
		}
	}
}

// TestLayerRules pins the rules themselves, so that a reversed import is still refused even if
// no package makes it today.
func TestLayerRules(t *testing.T) {
	for _, c := range []struct {
		from, to string
		ok       bool
	}{
		{"outbox", "consumer", false},
		{"outbox/pgoutbox", "consumer", false},
		{"outbox/sqliteoutbox", "consumer", false},
		{"outbox/internal/outboxstore", "consumer", false},
		{"outbox/outboxtest", "consumer", false},
		{"outbox", "outbox/outboxconsumer", false},
		{"consumer", "outbox/outboxconsumer", false},
		{"outbox/outboxconsumer", "consumer", true},
		{"outbox/outboxconsumer", "outbox", true},
		{"consumer", "outbox", true},
		{"consumer", "partition", true},
		{"partition", "consumer", false},
		{"partition/ring", "partition", true},
		{"consumer", "internal/lanes", true},
		{"internal/lanes", "partition", false},
		{"fence", "fence/pgfence", false},
		{"fence/pgfence", "fence", true},
		{"fence/pgfence", "internal/pgmigrate", true},
		{"internal/pgmigrate", "fence/pgfence", false},
		{"fence/pgfence", "partition", false},
		{"internal/operator/chaos", "outbox/outboxconsumer", true},
		{"internal/operator/chaos", "consumer", true},
		{"chaos", "consumer", true},
		{"consumer", "internal/operator/chaos", false},
		{"outbox/outboxconsumer", "internal/operator/chaos", false},
		{"internal/pgmigrate", "internal/operator/chaos", false},
		{"cmd/baton", "internal/operator/chaos", true},
		{"consumer/chaos", "internal/operator/chaos", true},
		{"internal/operator/chaos", "consumer/chaos", false},
		{"consumer", "consumer/chaos", false},
		{"outbox/outboxconsumer", "consumer/chaos", false},
		{"internal/operator/status", "outbox/pgoutbox", true},
		{"internal/operator/status", "internal/operator/timeline", true},
		{"consumer", "internal/operator/status", false},
		{"internal/sqlident", "fence/pgfence", false},
		{"consumer", "internal/operator/telemetry", false},
		{"internal/operator/status", "internal/operator/telemetry", true},
		{"internal/operator/chaos", "internal/operator/status", true},
		{"internal/pgmigrate", "internal/operator/status", false},
		{"fence", "internal/sqlident", false},
		{"cmd/baton", "internal/operator/telemetry", true},
		{"cmd/baton", "internal/readme", true},
		{"internal/readme", "consumer", true},
		{"internal/readme", "internal/lanes", false},
		{"consumer", "internal/readme", false},
		{"examples/twin", "outbox/outboxconsumer", true},
		{"examples/saga", "consumer/chaos", true},
		{"cmd/baton", "cmd/baton/internal/bench", true},
		{"cmd/baton/internal/bench/peers", "cmd/baton/internal/bench", true},
		{"consumer", "cmd/baton/internal/bench", false},
		{"examples/twin", "cmd/baton/internal/bench", false},
		{"examples/saga", "internal/operator/chaos", false},
		{"examples/twin", "internal/operator/telemetry", false},
		{"examples/lock-to-partition", "internal/operator/redislock", false},
		{"internal/operator/chaos", "examples/twin", false},
		{"consumer", "internal/testkit/testenv", false},
		{"internal/testkit/cmd/mutants", "internal/testkit/mutants", true},
		{"consumer", "internal/testkit/netfreeze", false},
		{"cmd/baton", "internal/testkit/testenv", false},
		{"examples/saga", "internal/testkit", false},
		{"internal/testkit/leasetest", "fence/pgfence", true},
		{"internal/testkit/leasetest", "outbox", false},
		{"fence/lease/etcdlease", "internal/testkit/leasetest", false},
	} {
		why := checkImport(c.from, c.to)
		if got := why == ""; got != c.ok {
			t.Errorf("%s imports %s: allowed = %v, want %v (%s)", c.from, c.to, got, c.ok, why)
		}
	}
}

// TestFenceIsALeaf: the contract package imports only the standard library, so every store and
// runtime can depend on it without dragging in a Kafka or database client.
func TestFenceIsALeaf(t *testing.T) {
	for _, p := range listPackages(t) {
		if p.ImportPath != module+"/fence" {
			continue
		}
		for _, imp := range p.Imports {
			if strings.Contains(strings.SplitN(imp, "/", 2)[0], ".") {
				t.Errorf("fence imports %s: fence must import only the standard library", imp)
			}
		}
		return
	}
	t.Fatal("package fence not found")
}
