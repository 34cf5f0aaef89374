package deploytest

import (
	"io/fs"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// sharedEnv is the one name per setting that every program reads: the baton command
// (cmd/baton/env.go), the twin member and migration (examples/twin/usage.txt), deploy/local's
// env.sh, and what deploy/compose and deploy/k8s set.
var sharedEnv = map[string]string{
	"brokers":    "BATON_KAFKA_BROKERS",
	"postgres":   "BATON_POSTGRES_URL",
	"group":      "BATON_GROUP",
	"log-format": "BATON_LOG_FORMAT",
	"log-level":  "BATON_LOG_LEVEL",
}

// renamedEnv are the names earlier releases read. They may occur only where a program refuses
// them (its renamedEnv table and the tests of that refusal) and in docs/upgrade.md.
var renamedEnv = []string{"BATON_BROKERS", "BATON_STORE", "BATON_DEMO_BROKERS", "BATON_DEMO_POSTGRES"}

// TestEnvironmentNamesAreOne: each setting has one variable name in every program and
// deployment file, and no file but the refusals uses a renamed one.
func TestEnvironmentNamesAreOne(t *testing.T) {
	// The twin reads the shared names.
	flags := loadProgram(t)
	for flag, env := range sharedEnv {
		if got := flags[flag].env; got != env {
			t.Errorf("twin -%s reads $%s, every other program $%s", flag, got, env)
		}
	}
	// The baton command reads them (its env.go names each once).
	src := readFile(t, "cmd/baton/env.go")
	for _, env := range sharedEnv {
		if !regexp.MustCompile(`= "` + env + `"`).MatchString(src) {
			t.Errorf("cmd/baton/env.go does not read $%s", env)
		}
	}
	for _, f := range []string{"operate.go", "audit.go", "demo.go", "main.go"} {
		for _, m := range regexp.MustCompile(`Getenv\("(BATON_[A-Z_]+)"\)`).FindAllStringSubmatch(readFile(t, "cmd/baton/"+f), -1) {
			t.Errorf("cmd/baton/%s reads $%s by a literal: use env.go's names", f, m[1])
		}
	}
	// deploy/local exports them for the tests and the shell.
	for script, env := range map[string]string{"kafka.sh": "BATON_KAFKA_BROKERS", "postgres.sh": "BATON_POSTGRES_URL"} {
		if !strings.Contains(readFile(t, "deploy/local/"+script), "export "+env+"=") {
			t.Errorf("deploy/local/%s env does not export $%s", script, env)
		}
	}
	// Whatever a deployment sets is read by the program.
	read := map[string]bool{}
	for _, f := range flags {
		if f.env != "" {
			read[f.env] = true
		}
	}
	setIn := regexp.MustCompile(`(?m)^\s*(?:- name: )?(BATON_[A-Z_]+)\b`)
	for _, file := range []string{"deploy/compose/compose.yaml", "deploy/k8s/configmap.yaml", "deploy/k8s/statefulset.yaml", "deploy/k8s/migrate-job.yaml"} {
		for _, m := range setIn.FindAllStringSubmatch(readFile(t, file), -1) {
			if !read[m[1]] && !strings.HasSuffix(m[1], "_PASSWORD") {
				t.Errorf("%s sets $%s, which no program reads", file, m[1])
			}
		}
	}
	// No renamed name survives outside its refusal.
	allowed := map[string]bool{
		"cmd/baton/env.go": true, "cmd/baton/env_test.go": true,
		"examples/twin/flags.go": true, "examples/twin/serve_test.go": true,
		"docs/upgrade.md": true, "internal/deploytest/envnames_test.go": true,
	}
	old := regexp.MustCompile(`\b(` + strings.Join(renamedEnv, "|") + `)\b`)
	for _, dir := range []string{"cmd", "examples", "deploy", "internal", "docs", "README.md", "DESIGN.md", "Makefile"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			if allowed[filepath.ToSlash(rel)] || !slices.Contains([]string{".go", ".md", ".sh", ".yaml", ".yml", ".txt", ".json", ""}, filepath.Ext(path)) {
				return nil
			}
			text := readFile(t, rel)
			if m := old.FindString(text); m != "" {
				t.Errorf("%s uses $%s, a name no program reads any more (docs/upgrade.md names its replacement)", rel, m)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
