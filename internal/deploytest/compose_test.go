package deploytest

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
)

const composeFile = "deploy/compose/compose.yaml"

// loadCompose loads content as deploy/compose/compose.yaml with the compose specification's
// own loader: the JSON schema validation, interpolation (with an empty environment, so the
// file's defaults apply), merge keys and the consistency checks all run.
func loadCompose(t *testing.T, content []byte) (*types.Project, error) {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join(root, "deploy/compose"))
	if err != nil {
		t.Fatal(err)
	}
	return loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  dir,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(dir, "compose.yaml"), Content: content}},
		Environment: types.Mapping{},
	}, func(o *loader.Options) { o.SetProjectName("baton", true) })
}

func project(t *testing.T) *types.Project {
	t.Helper()
	p, err := loadCompose(t, []byte(readFile(t, composeFile)))
	if err != nil {
		t.Fatalf("%s: %v", composeFile, err)
	}
	return p
}

// TestComposeLoaderRejects proves the loader validates: a misspelt service key and a
// dependency on a missing service fail.
func TestComposeLoaderRejects(t *testing.T) {
	good := readFile(t, composeFile)
	for name, bad := range map[string]string{
		"unknown key":     strings.Replace(good, "  stop_grace_period: 45s", "  stop_grace_periods: 45s", 1),
		"missing service": strings.Replace(good, "    depends_on: [prometheus]", "    depends_on: [promethe]", 1),
	} {
		if bad == good {
			t.Fatalf("%s: the mutation did not apply", name)
		}
		if _, err := loadCompose(t, []byte(bad)); err == nil {
			t.Errorf("%s: loaded without error", name)
		}
	}
}

func TestCompose(t *testing.T) {
	p := project(t)
	for _, s := range []string{"kafka", "kafka-init", "postgres", "migrate", "otel-collector", "prometheus", "grafana", "twin-1", "twin-2", "twin-3"} {
		if _, ok := p.Services[s]; !ok {
			t.Errorf("no service %s", s)
		}
	}
	// Kafka in KRaft mode: broker and controller in one node, no ZooKeeper.
	kafka := p.Services["kafka"]
	if env(kafka, "KAFKA_PROCESS_ROLES") != "broker,controller" || env(kafka, "KAFKA_CONTROLLER_QUORUM_VOTERS") == "" {
		t.Error("kafka must run in KRaft mode (process.roles broker,controller and a controller quorum)")
	}
	for name := range p.Services {
		if strings.Contains(strings.ToLower(name), "zookeeper") {
			t.Errorf("service %s: KRaft needs no ZooKeeper", name)
		}
	}
	// Three members with distinct, stable instance ids.
	ids := map[string]bool{}
	for _, s := range twins(p) {
		id := env(s, "BATON_INSTANCE_ID")
		if id == "" || ids[id] {
			t.Errorf("%s: BATON_INSTANCE_ID %q must be set and unique", s.Name, id)
		}
		ids[id] = true
	}
	if len(ids) != 3 {
		t.Errorf("%d twins with instance ids, want 3", len(ids))
	}
	// Migrations run before the members, which start after the topics exist.
	for _, s := range twins(p) {
		for _, dep := range []string{"migrate", "kafka-init"} {
			if d, ok := s.DependsOn[dep]; !ok || d.Condition != types.ServiceConditionCompletedSuccessfully {
				t.Errorf("%s must wait for %s to complete successfully", s.Name, dep)
			}
		}
	}
}

// twins returns the compose services that run the twin member.
func twins(p *types.Project) []types.ServiceConfig {
	var out []types.ServiceConfig
	for _, name := range []string{"twin-1", "twin-2", "twin-3"} {
		if s, ok := p.Services[name]; ok {
			out = append(out, s)
		}
	}
	return out
}

// env returns a service's environment variable ("" if unset).
func env(s types.ServiceConfig, name string) string {
	if v, ok := s.Environment[name]; ok && v != nil {
		return *v
	}
	return ""
}
