package mutants

import (
	"bytes"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// Every patch has its entry in All and every entry its patch, and each patch applies to the
// checkout as it is (git apply --check: nothing is written). The runner ('make mutants') then
// shows that each builds and is killed.
func TestEveryMutantHasItsPatchAndApplies(t *testing.T) {
	files, err := PatchFiles()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, f := range files {
		have[f] = true
	}
	root, err := ModuleRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, m := range All {
		f := m.Package + "/" + m.Name + ".patch"
		switch {
		case seen[m.Name]:
			t.Errorf("%s listed twice", m.Name)
		case !have[f]:
			t.Errorf("%s: no patch %s", m.Name, f)
		case len(m.Guards) == 0 || m.Bug == "":
			t.Errorf("%s: no guard or no description", m.Name)
		case m.Group != GroupSafety && m.Group != GroupFull:
			t.Errorf("%s: group %q", m.Name, m.Group)
		case m.Safety && m.Want == "":
			t.Errorf("%s: a safety mutant's Want must name the cause its guards assert", m.Name)
		}
		if m.Want != "" {
			if _, err := regexp.Compile(m.Want); err != nil {
				t.Errorf("%s: Want: %v", m.Name, err)
			}
		}
		seen[m.Name] = true
		delete(have, f)
		p, err := m.Patch()
		if err != nil {
			continue
		}
		// A patch breaks production code only: one that also broke a test (the model's copy
		// of a rule, say) would be caught by that test whatever production does.
		for _, f := range regexp.MustCompile(`(?m)^\+\+\+ b/(\S+)`).FindAllStringSubmatch(string(p), -1) {
			if strings.HasSuffix(f[1], "_test.go") {
				t.Errorf("%s: the patch edits the test file %s", m.Name, f[1])
			}
		}
		cmd := exec.Command("git", "apply", "--check", "-")
		cmd.Dir, cmd.Stdin = root, bytes.NewReader(p)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s no longer applies: %v\n%s", m.Name, err, out)
		}
	}
	for f := range have {
		t.Errorf("%s: a patch no mutant lists", f)
	}
}
