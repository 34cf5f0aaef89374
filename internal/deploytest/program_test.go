package deploytest

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The program the deployments run is examples/twin; its flags are read from
// examples/twin/usage.txt, which is `twin -h` (examples/twin's TestUsageFile keeps the two
// equal). This module imports no Baton package, so the usage text is the contract between them.
const usageFile = "examples/twin/usage.txt"

// programFlag is one flag of the program, as its usage text describes it.
type programFlag struct {
	value bool   // takes a value (every flag but a boolean one)
	env   string // the $BATON_* variable it falls back to with -serve or -migrate, if any
	doc   string
}

var (
	usageFlag = regexp.MustCompile(`(?m)^  -([a-z][a-z-]*)( \S+)?\n[ \t]+(.*)$`)
	usageEnv  = regexp.MustCompile(`\$(BATON_[A-Z_]+)`)
)

// parseUsage reads the flags out of a `twin -h` text.
func parseUsage(t *testing.T, text string) map[string]programFlag {
	t.Helper()
	flags := map[string]programFlag{}
	for _, m := range usageFlag.FindAllStringSubmatch(text, -1) {
		f := programFlag{value: m[2] != "", doc: m[3]}
		if e := usageEnv.FindStringSubmatch(m[3]); e != nil {
			f.env = e[1]
		}
		flags[m[1]] = f
	}
	if len(flags) < 3 || flags["serve"].doc == "" || flags["migrate"].doc == "" {
		t.Fatalf("%s: no -serve and -migrate among the flags %v", usageFile, flags)
	}
	return flags
}

func loadProgram(t *testing.T) map[string]programFlag {
	t.Helper()
	return parseUsage(t, readFile(t, usageFile))
}

// parseArgs parses a command line of the program ("twin" then flags) as Go's flag package
// would, and returns the flags given (a boolean flag maps to "true"); it reports every problem.
func parseArgs(t *testing.T, flags map[string]programFlag, where string, args []string) map[string]string {
	t.Helper()
	got, problems := checkArgs(flags, args)
	for _, p := range problems {
		t.Errorf("%s runs %q: %s", where, args, p)
	}
	return got
}

func checkArgs(flags map[string]programFlag, args []string) (map[string]string, []string) {
	got := map[string]string{}
	if len(args) == 0 || args[0] != "twin" {
		return got, []string{"want the twin program"}
	}
	var problems []string
	for i := 1; i < len(args); i++ {
		name, val, hasVal := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		f, ok := flags[name]
		switch {
		case !strings.HasPrefix(args[i], "-"):
			problems = append(problems, fmt.Sprintf("%q is not a flag (the program takes no arguments)", args[i]))
			continue
		case !ok:
			problems = append(problems, fmt.Sprintf("the program has no flag -%s (%s)", name, usageFile))
			continue
		case f.value && !hasVal:
			if i+1 >= len(args) {
				problems = append(problems, fmt.Sprintf("-%s needs a value", name))
				continue
			}
			i++
			val = args[i]
		case !f.value && !hasVal:
			val = "true"
		}
		got[name] = val
	}
	return got, problems
}

// dockerCmd returns the Dockerfile's CMD (exec form).
func dockerCmd(t *testing.T, dockerfile string) []string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^CMD (\[.*\])$`).FindStringSubmatch(dockerfile)
	var cmd []string
	if m == nil || json.Unmarshal([]byte(m[1]), &cmd) != nil {
		t.Fatal("twin.Dockerfile: no CMD in exec form")
	}
	return cmd
}

// TestCommandLinesMatchTheProgram checks every command line the deployments run against the
// program's real flags: the members run -serve, the migration -migrate, every flag exists and
// has its value, and each $BATON_* variable they set is one the program reads.
func TestCommandLinesMatchTheProgram(t *testing.T) {
	flags := loadProgram(t)
	p, m := project(t), loadManifests(t)
	sts := m.statefulSets[0].Spec.Template.Spec.Containers[0]
	job := m.jobs[0].Spec.Template.Spec.Containers[0]
	members := map[string][]string{
		"twin.Dockerfile's CMD": dockerCmd(t, readFile(t, "deploy/compose/twin.Dockerfile")),
		"the StatefulSet":       sts.Args,
	}
	for _, s := range twins(p) {
		members["compose "+s.Name] = s.Command
	}
	for where, args := range members {
		if got := parseArgs(t, flags, where, args); got["serve"] == "" || got["migrate"] != "" {
			t.Errorf("%s runs %q: a member runs -serve ADDR", where, args)
		}
	}
	for where, args := range map[string][]string{"compose migrate": p.Services["migrate"].Command, "the migration Job": job.Args} {
		if got := parseArgs(t, flags, where, args); got["migrate"] != "true" || got["serve"] != "" {
			t.Errorf("%s runs %q: the migration runs -migrate", where, args)
		}
	}

	// The environment: every BATON_* variable set is one the program reads, and a member gets
	// what it cannot run without (brokers, database) from somewhere.
	read := map[string]bool{}
	for _, f := range flags {
		if f.env != "" {
			read[f.env] = true
		}
	}
	check := func(where string, names []string) {
		for _, n := range names {
			if strings.HasPrefix(n, "BATON_") && !read[n] {
				t.Errorf("%s sets %s, which the program does not read (%s names %v)", where, n, usageFile, mapKeys(read))
			}
		}
	}
	k8sMember := mapKeys(m.configMaps[0].Data)
	for _, e := range sts.Env {
		k8sMember = append(k8sMember, e.Name)
	}
	check("the StatefulSet", k8sMember)
	var jobEnv []string
	for _, e := range job.Env {
		jobEnv = append(jobEnv, e.Name)
	}
	check("the migration Job", jobEnv)
	check("compose migrate", mapKeys(p.Services["migrate"].Environment))
	for _, s := range twins(p) {
		check("compose "+s.Name, mapKeys(s.Environment))
	}
	for _, need := range []string{"brokers", "postgres"} {
		if !slices.Contains(k8sMember, flags[need].env) {
			t.Errorf("the StatefulSet gives the member no -%s ($%s)", need, flags[need].env)
		}
	}
	if !slices.Contains(jobEnv, flags["postgres"].env) {
		t.Errorf("the migration Job gives no -postgres ($%s)", flags["postgres"].env)
	}
}

// TestProbesMatchTheProgram: the paths the probes and Prometheus use are the ones -serve
// serves, on the port it listens on (TestPortsAgree: the container's http port).
func TestProbesMatchTheProgram(t *testing.T) {
	serves := regexp.MustCompile(`/[a-z]+`).FindAllString(loadProgram(t)["serve"].doc, -1)
	m := loadManifests(t)
	pod := m.statefulSets[0].Spec.Template
	c := pod.Spec.Containers[0]
	paths := map[string]string{"prometheus.io/path annotation": pod.Annotations["prometheus.io/path"]}
	if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil {
		paths["readiness probe"] = c.ReadinessProbe.HTTPGet.Path
	}
	if c.LivenessProbe != nil && c.LivenessProbe.HTTPGet != nil {
		paths["liveness probe"] = c.LivenessProbe.HTTPGet.Path
	}
	if len(paths) != 3 {
		t.Errorf("want an httpGet readiness and liveness probe, got %v", paths)
	}
	for what, path := range paths {
		if !slices.Contains(serves, path) {
			t.Errorf("the %s GETs %q; -serve serves %v (%s)", what, path, serves, usageFile)
		}
	}
}

// The checks above fail on the mistakes they exist for: a flag the program does not have, a
// missing value, an argument, another program, a probe path -serve does not serve.
func TestProgramChecksCatchMistakes(t *testing.T) {
	flags := parseUsage(t, readFile(t, usageFile))
	for _, args := range [][]string{
		{"twin", "-serv", ":8080"},
		{"twin", "-serve"},
		{"twin", "serve"},
		{"baton", "migrate"},
		{"twin", "-migrate", "-app-rol", "x"},
	} {
		if _, problems := checkArgs(flags, args); len(problems) == 0 {
			t.Errorf("%q passed the check", args)
		}
	}
	if got := parseArgs(t, flags, "test", []string{"twin", "-serve", ":8080", "-session-timeout=45s"}); got["serve"] != ":8080" || got["session-timeout"] != "45s" {
		t.Errorf("parsed %v", got)
	}
	if flags["postgres"].env != "BATON_POSTGRES_URL" || flags["migrate"].value || !flags["serve"].value {
		t.Errorf("usage parsed wrongly: %+v", flags)
	}
}

func mapKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
