// Command exports counts the exported identifiers of Baton's public packages, as `go doc -all`
// prints them, and fails when a package, or the total, is above its line in the budget file.
//
// A public package is one `go list ./...` lists that is not a command (package main) and has
// no "internal" or "examples" element in its import path. Counted, each once: every exported
// top-level const, var, func and type (each name of a grouped declaration) and every method of
// an exported type. Not counted: the fields of a struct type and the methods of an interface
// type (they belong to the one type a user learns), and anything go doc -all leaves out
// (unexported names, test files).
//
// Usage, from the module's root:
//
//	go run ./internal/testkit/exports [-budget FILE]
//
// The budget file has one "path N" line per public package (its import path without the
// module's, e.g. "consumer") and a "total N" line; blank lines and lines starting with # are
// ignored. A public package without a line fails,
// so a new package states its own budget.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode"
)

func main() {
	budget := flag.String("budget", "internal/testkit/exports/budget.txt", "the budget file")
	flag.Parse()
	if err := run(*budget); err != nil {
		fmt.Fprintln(os.Stderr, "exports:", err)
		os.Exit(1)
	}
}

func run(budgetFile string) error {
	pkgs, err := publicPackages()
	if err != nil {
		return err
	}
	limits, total, err := readBudget(budgetFile)
	if err != nil {
		return err
	}
	var failed []string
	sum := 0
	fmt.Printf("%-32s %6s %6s\n", "package", "count", "budget")
	for _, p := range pkgs {
		doc, err := exec.Command("go", "doc", "-all", "./"+p).Output()
		if err != nil {
			return fmt.Errorf("go doc -all %s: %w", p, err)
		}
		n := count(string(doc))
		sum += n
		limit, ok := limits[p]
		mark := ""
		switch {
		case !ok:
			mark = "  no budget line"
			failed = append(failed, p+": no budget line")
		case n > limit:
			mark = "  OVER"
			failed = append(failed, fmt.Sprintf("%s: %d exported identifiers, budget %d", p, n, limit))
		}
		fmt.Printf("%-32s %6d %6s%s\n", p, n, budgetString(limit, ok), mark)
	}
	fmt.Printf("%-32s %6d %6d\n", "total", sum, total)
	if sum > total {
		failed = append(failed, fmt.Sprintf("total: %d exported identifiers, budget %d", sum, total))
	}
	if len(failed) > 0 {
		return fmt.Errorf("over budget:\n  %s", strings.Join(failed, "\n  "))
	}
	return nil
}

func budgetString(n int, ok bool) string {
	if !ok {
		return "-"
	}
	return strconv.Itoa(n)
}

// publicPackages lists the module's public packages, sorted.
func publicPackages() ([]string, error) {
	mod, err := exec.Command("go", "list", "-m").Output()
	if err != nil {
		return nil, fmt.Errorf("go list -m: %w", err)
	}
	prefix := strings.TrimSpace(string(mod)) + "/"
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{.Name}}", "./...").Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w", err)
	}
	var pkgs []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, name, _ := strings.Cut(line, " ")
		if name == "main" || hasElem(path, "internal") || hasElem(path, "examples") {
			continue
		}
		pkgs = append(pkgs, strings.TrimPrefix(path, prefix))
	}
	sort.Strings(pkgs)
	return pkgs, nil
}

func hasElem(path, elem string) bool {
	for _, e := range strings.Split(path, "/") {
		if e == elem {
			return true
		}
	}
	return false
}

func readBudget(file string) (map[string]int, int, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	limits := map[string]int{}
	total := -1
	sc := bufio.NewScanner(f)
	for ln := 1; sc.Scan(); ln++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return nil, 0, fmt.Errorf("%s:%d: want \"path N\"", file, ln)
		}
		n, err := strconv.Atoi(fields[1])
		if err != nil {
			return nil, 0, fmt.Errorf("%s:%d: %w", file, ln, err)
		}
		if fields[0] == "total" {
			total = n
		} else {
			limits[fields[0]] = n
		}
	}
	if err := sc.Err(); err != nil {
		return nil, 0, err
	}
	if total < 0 {
		return nil, 0, fmt.Errorf("%s: no total line", file)
	}
	return limits, total, nil
}

var (
	declRE   = regexp.MustCompile(`^(const|var|func|type) (\(|[A-Za-z_]\w*)`)
	methodRE = regexp.MustCompile(`^func \([^)]*\) ([A-Za-z_]\w*)`)
	memberRE = regexp.MustCompile(`^\t([A-Za-z_][\w.]*(?:, *[A-Za-z_]\w*)*)`)
)

// count counts the exported identifiers in the output of go doc -all for one package.
func count(doc string) int {
	n := 0
	// block is the kind of the open top-level block: "const" or "var" for a grouped
	// declaration, "type" for a struct or interface body, "" outside.
	block := ""
	// The package's doc comment comes first; a line of it may wrap to look like a
	// declaration ("type (...)"): counting starts at the first section heading.
	inDecls := false
	for _, line := range strings.Split(doc, "\n") {
		switch line {
		case "CONSTANTS", "VARIABLES", "FUNCTIONS", "TYPES":
			inDecls = true
			continue
		}
		if !inDecls {
			continue
		}
		if block != "" {
			if line == ")" || line == "}" {
				block = ""
				continue
			}
			if block == "type" {
				continue
			}
			m := memberRE.FindStringSubmatch(line)
			if m == nil || strings.HasPrefix(strings.TrimSpace(line), "//") {
				continue
			}
			for _, name := range strings.Split(m[1], ",") {
				name = strings.TrimSpace(name)
				if i := strings.LastIndex(name, "."); i >= 0 { // an embedded pkg.Type
					name = name[i+1:]
				}
				if exported(name) {
					n++
				}
			}
			continue
		}
		if m := methodRE.FindStringSubmatch(line); m != nil {
			if exported(m[1]) {
				n++
			}
			continue
		}
		m := declRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		switch {
		case m[2] == "(":
			block = m[1] // a grouped const or var
		case exported(m[2]):
			n++
			if m[1] == "type" && (strings.HasSuffix(line, "struct {") || strings.HasSuffix(line, "interface {")) {
				block = "type"
			}
		}
	}
	return n
}

func exported(name string) bool {
	for _, r := range name {
		return unicode.IsUpper(r)
	}
	return false
}
