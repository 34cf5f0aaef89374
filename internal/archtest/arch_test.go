package archtest

import (
	"encoding/json"
	"errors"
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
// fence is the leaf contract; partition routes; consumer runs partitions; outbox relays effects.
// internal/ helpers sit below everything that uses them; cmd/ and examples/ sit on top.
func layer(r string) int {
	switch {
	case r == "fence":
		return 0
	case under(r, "internal/chaos"): // the harness drives everything below it
		return 6
	case under(r, "internal"):
		return 1
	case under(r, "fence"):
		return 2
	case under(r, "partition"):
		return 3
	case under(r, "consumer"):
		return 4
	case under(r, "outbox"):
		return 5
	case under(r, "cmd"), under(r, "examples"):
		return 9
	}
	return 8
}

func TestImportDirection(t *testing.T) {
	pkgs := listPackages(t)
	for _, p := range pkgs {
		r := rel(p.ImportPath)
		app := under(r, "cmd") || under(r, "examples")
		for _, imp := range p.Imports {
			if isOurs(imp) {
				ir := rel(imp)
				if under(ir, "cmd") || under(ir, "examples") {
					t.Errorf("%s imports %s: nothing imports cmd/ or examples/", r, ir)
				}
				if ir == "internal/testenv" {
					t.Errorf("%s imports %s: test plumbing is for _test.go files only", r, ir)
				}
				if !app && layer(ir) > layer(r) {
					t.Errorf("%s (layer %d) imports %s (layer %d): imports must point down", r, layer(r), ir, layer(ir))
				}
			}
			if !app && strings.HasPrefix(imp, "go.opentelemetry.io/otel/sdk") {
				t.Errorf("%s imports %s: only cmd/ and examples/ may import the OpenTelemetry SDK", r, imp)
			}
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
