package archtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
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

// layer orders the library packages: a package may import ours only from a lower or equal layer.
//
//	fence < internal/* < fence/* < partition/* < outbox (and its stores) < consumer/*
//	      < outbox/outboxconsumer < internal/chaos < consumer/chaos < cmd/, examples/
//
// fence is the leaf contract; internal/ helpers sit below everything that uses them; the fence
// stores implement fence; partition names and routes; the outbox relays effects under a fence
// key and token without knowing who owns them; the consumer owns partitions and may call the
// outbox through its AfterCommit hook; outbox/outboxconsumer is the glue that needs both (it is
// the one outbox package above the consumer). internal/chaos is the exception among internal/
// packages: a harness driving the whole stack, so it sits on top of the library;
// internal/status (the operator's commands) sits beside it; consumer/chaos, the harness's public
// face for a user's own workload, sits on it. cmd/ and examples/ sit on top.
func layer(r string) int {
	switch {
	case r == "fence":
		return 0
	case under(r, "consumer/chaos"): // the harness's public face, on top of it
		return 8
	case under(r, "internal/chaos"): // the harness drives everything below it
		return 7
	case under(r, "internal/status"): // the operator's tools read the stores and the group
		return 7
	case under(r, "internal/telemetry"): // an application's SDK wiring, used by cmd/ and examples/
		return 8
	case under(r, "internal"):
		return 1
	case under(r, "fence"):
		return 2
	case under(r, "partition"):
		return 3
	case under(r, "outbox/outboxconsumer"):
		return 6
	case under(r, "outbox"):
		return 4
	case under(r, "consumer"):
		return 5
	case under(r, "cmd"), under(r, "examples"):
		return 9
	}
	return 8
}

// internal/telemetry is an application's wiring of the OpenTelemetry SDK (Prometheus, OTLP): it may
// import the SDK, and only cmd/ may import it (an example writes its own, for users to copy).

// ownInternal reports whether ir is an internal package of the command or example r belongs to
// (cmd/baton imports cmd/baton/internal/...).
func ownInternal(r, ir string) bool {
	i := strings.Index(ir, "/internal/")
	return i > 0 && under(r, ir[:i])
}

// checkImport returns why package r may not import ir (both relative to the module), or "".
func checkImport(r, ir string) string {
	app := under(r, "cmd") || under(r, "examples")
	switch {
	case (under(ir, "cmd") || under(ir, "examples")) && !ownInternal(r, ir):
		return "nothing imports cmd/ or examples/ (but a command its own internal packages)"
	case under(r, "examples") && under(ir, "internal"):
		return "an example imports only public packages: a user copies it out of this module"
	case under(ir, "internal/telemetry") && !app:
		return "internal/telemetry is an application's SDK wiring: only cmd/ imports it"
	case ir == "internal/testenv" || under(ir, "internal/testkit"):
		return "test plumbing is for _test.go files only"
	case !app && layer(ir) > layer(r):
		return fmt.Sprintf("layer %d imports layer %d: imports must point down", layer(r), layer(ir))
	}
	return ""
}

func TestImportDirection(t *testing.T) {
	pkgs := listPackages(t)
	for _, p := range pkgs {
		r := rel(p.ImportPath)
		app := under(r, "cmd") || under(r, "examples")
		for _, imp := range p.Imports {
			if isOurs(imp) {
				if why := checkImport(r, rel(imp)); why != "" {
					t.Errorf("%s imports %s: %s", r, rel(imp), why)
				}
			}
			if !app && !under(r, "internal/telemetry") && strings.HasPrefix(imp, "go.opentelemetry.io/otel/sdk") {
				t.Errorf("%s imports %s: only cmd/ and examples/ may import the OpenTelemetry SDK", r, imp)
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
		{"outbox/outboxstore", "consumer", false},
		{"outbox/outboxtest", "consumer", false},
		{"outbox", "outbox/outboxconsumer", false},
		{"consumer", "outbox/outboxconsumer", false},
		{"outbox/outboxconsumer", "consumer", true},
		{"outbox/outboxconsumer", "outbox", true},
		{"consumer", "outbox", true},
		{"consumer", "partition", true},
		{"partition", "consumer", false},
		{"partition/lanes", "partition", true},
		{"partition/ring", "partition/lanes", true}, // same layer
		{"fence", "fence/pgfence", false},
		{"fence/pgfence", "fence", true},
		{"fence/pgfence", "internal/pgmigrate", true},
		{"internal/pgmigrate", "fence/pgfence", false},
		{"fence/pgfence", "partition", false},
		{"internal/chaos", "outbox/outboxconsumer", true},
		{"internal/chaos", "consumer", true},
		{"chaos", "consumer", true},
		{"consumer", "internal/chaos", false},
		{"outbox/outboxconsumer", "internal/chaos", false},
		{"internal/pgmigrate", "internal/chaos", false},
		{"cmd/baton", "internal/chaos", true},
		{"consumer/chaos", "internal/chaos", true},
		{"internal/chaos", "consumer/chaos", false},
		{"consumer", "consumer/chaos", false},
		{"outbox/outboxconsumer", "consumer/chaos", false},
		{"internal/status", "outbox/pgoutbox", true},
		{"internal/status", "internal/timeline", true},
		{"consumer", "internal/status", false},
		{"internal/timeline", "fence/pgfence", false},
		{"consumer", "internal/telemetry", false},
		{"internal/status", "internal/telemetry", false},
		{"cmd/baton", "internal/telemetry", true},
		{"examples/twin", "outbox/outboxconsumer", true},
		{"examples/saga", "consumer/chaos", true},
		{"cmd/baton", "cmd/baton/internal/bench", true},
		{"cmd/baton/internal/bench/peers", "cmd/baton/internal/bench", true},
		{"consumer", "cmd/baton/internal/bench", false},
		{"examples/twin", "cmd/baton/internal/bench", false},
		{"examples/saga", "internal/chaos", false},
		{"examples/twin", "internal/telemetry", false},
		{"examples/lock-to-partition", "internal/redislock", false},
		{"internal/chaos", "examples/twin", false},
		{"consumer", "internal/testenv", false},
		{"consumer", "internal/testkit/netfreeze", false},
		{"cmd/baton", "internal/testkit/testenv", false},
		{"examples/saga", "internal/testkit", false},
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
