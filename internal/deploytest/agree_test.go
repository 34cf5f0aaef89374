package deploytest

import (
	"fmt"
	"maps"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"
)

// readme is what deploy/README.md states about the application contract.
type readme struct {
	image     string
	ports     map[string]string            // port -> name
	memberEnv map[string]map[string]string // variable -> column (Compose, Kubernetes) -> text
	migEnv    map[string]map[string]string
}

var (
	readmeImage = regexp.MustCompile("(?m)^Image: `([^`]+)`")
	tableRow    = regexp.MustCompile("(?m)^\\| `([^`]+)` \\| (.*) \\|$")
)

// envTable parses the first table after heading: rows "| `NAME` | compose | kubernetes | meaning |".
func envTable(t *testing.T, text, heading string) map[string]map[string]string {
	t.Helper()
	i := strings.Index(text, heading)
	if i < 0 {
		t.Fatalf("deploy/README.md has no %q", heading)
	}
	text = text[i:]
	start := strings.Index(text, "\n|")
	if start < 0 {
		t.Fatalf("deploy/README.md: no table after %q", heading)
	}
	text = text[start+1:]
	if end := strings.Index(text, "\n\n"); end >= 0 {
		text = text[:end]
	}
	out := map[string]map[string]string{}
	for _, m := range tableRow.FindAllStringSubmatch(text, -1) {
		cols := strings.Split(m[2], " | ")
		if len(cols) != 3 {
			t.Fatalf("deploy/README.md, %s: row %s has %d columns", heading, m[1], len(cols)+1)
		}
		out[m[1]] = map[string]string{"compose": cols[0], "k8s": cols[1]}
	}
	if len(out) == 0 {
		t.Fatalf("deploy/README.md: empty table after %q", heading)
	}
	return out
}

func parseReadme(t *testing.T) readme {
	t.Helper()
	text := readFile(t, "deploy/README.md")
	r := readme{ports: map[string]string{}}
	m := readmeImage.FindStringSubmatch(text)
	if m == nil {
		t.Fatal("deploy/README.md names no image (a line \"Image: `...`\")")
	}
	r.image = m[1]
	for _, row := range tableRow.FindAllStringSubmatch(text, -1) {
		if _, err := strconv.Atoi(row[1]); err == nil {
			r.ports[row[1]] = strings.TrimSpace(strings.Split(row[2], " | ")[0])
		}
	}
	r.memberEnv = envTable(t, text, "Environment of the member")
	r.migEnv = envTable(t, text, "Environment of the migration")
	return r
}

// single returns the one backquoted value of a README cell, or "" if the cell is prose.
func single(cell string) string {
	if m := regexp.MustCompile("^`([^`]+)`$").FindStringSubmatch(strings.TrimSpace(cell)); m != nil {
		return m[1]
	}
	return ""
}

func TestImagesAgree(t *testing.T) {
	p, m, r := project(t), loadManifests(t), parseReadme(t)
	want := r.image
	got := map[string]string{
		"compose migrate": p.Services["migrate"].Image,
		"k8s StatefulSet": m.statefulSets[0].Spec.Template.Spec.Containers[0].Image,
		"k8s migrate Job": m.jobs[0].Spec.Template.Spec.Containers[0].Image,
	}
	for _, s := range append(twins(p), p.Services["migrate"]) {
		got["compose "+s.Name] = s.Image
		if s.Build == nil || s.Build.Dockerfile != "deploy/compose/twin.Dockerfile" {
			t.Errorf("compose %s: want build from deploy/compose/twin.Dockerfile, got %+v", s.Name, s.Build)
		}
	}
	for where, img := range got {
		if img != want {
			t.Errorf("%s runs image %q, deploy/README.md says %q", where, img, want)
		}
	}
	// What runs in the image: the Dockerfile's default, compose's command and k8s's args are one
	// command line (program_test.go checks it against the program's flags).
	docker := readFile(t, "deploy/compose/twin.Dockerfile")
	cmd := dockerCmd(t, docker)
	for _, s := range twins(p) {
		if !slices.Equal([]string(s.Command), cmd) {
			t.Errorf("compose %s runs %v, the Dockerfile's CMD %v", s.Name, s.Command, cmd)
		}
	}
	if a := m.statefulSets[0].Spec.Template.Spec.Containers[0].Args; !slices.Equal(a, cmd) {
		t.Errorf("the StatefulSet runs %v, the Dockerfile's CMD %v", a, cmd)
	}
	if !slices.Equal([]string(p.Services["migrate"].Command), m.jobs[0].Spec.Template.Spec.Containers[0].Args) {
		t.Errorf("compose migrate runs %v, the Job %v", p.Services["migrate"].Command, m.jobs[0].Spec.Template.Spec.Containers[0].Args)
	}
	// The builder's Go is the module's.
	goMod := readFile(t, "go.mod")
	gv := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(goMod)
	if gv == nil || !strings.Contains(docker, "FROM golang:"+gv[1]+" ") {
		t.Errorf("twin.Dockerfile must build with golang:%v (go.mod)", gv)
	}
	for _, pkg := range []string{"./examples/twin", "./cmd/baton"} {
		if !strings.Contains(docker, pkg) {
			t.Errorf("twin.Dockerfile does not build %s", pkg)
		}
	}
}

func TestPortsAgree(t *testing.T) {
	p, m, r := project(t), loadManifests(t), parseReadme(t)
	c := m.statefulSets[0].Spec.Template.Spec.Containers[0]
	port, _ := containerPort(c, "http")
	want := strconv.Itoa(int(port))
	if r.ports[want] != "http" || len(r.ports) != 1 {
		t.Errorf("deploy/README.md ports %v, the StatefulSet serves http on %s", r.ports, want)
	}
	for _, s := range twins(p) {
		if !slices.Equal([]string(s.Expose), []string{want}) {
			t.Errorf("compose %s exposes %v, want %s", s.Name, s.Expose, want)
		}
	}
	// The member listens where -serve says (the command lines are one: TestImagesAgree).
	serveAddr := parseArgs(t, loadProgram(t), "the StatefulSet", c.Args)["serve"]
	if _, pt, err := net.SplitHostPort(serveAddr); err != nil || pt != want {
		t.Errorf("the member serves on -serve %q, the StatefulSet's http port is %s", serveAddr, want)
	}
	if a := m.statefulSets[0].Spec.Template.Annotations["prometheus.io/port"]; a != want {
		t.Errorf("k8s: prometheus.io/port %q, want %s", a, want)
	}
	if !strings.Contains(readFile(t, "deploy/compose/twin.Dockerfile"), "EXPOSE "+want+"\n") {
		t.Errorf("twin.Dockerfile does not EXPOSE %s", want)
	}

	// Prometheus scrapes every compose twin on that port, the status page and the auditor, and
	// nothing else.
	var prom struct {
		ScrapeConfigs []struct {
			JobName       string `json:"job_name"`
			MetricsPath   string `json:"metrics_path"`
			StaticConfigs []struct {
				Targets []string `json:"targets"`
			} `json:"static_configs"`
		} `json:"scrape_configs"`
	}
	if err := yaml.Unmarshal([]byte(readFile(t, "deploy/compose/prometheus.yml")), &prom); err != nil {
		t.Fatal(err)
	}
	var targets []string
	for _, sc := range prom.ScrapeConfigs {
		if sc.MetricsPath != "/metrics" {
			t.Errorf("prometheus.yml job %s scrapes %q, want /metrics", sc.JobName, sc.MetricsPath)
		}
		for _, st := range sc.StaticConfigs {
			targets = append(targets, st.Targets...)
		}
	}
	var wantTargets []string
	for _, s := range twins(p) {
		wantTargets = append(wantTargets, s.Name+":"+want)
	}
	// And the operator's processes, on the port their -http flag names.
	for _, name := range []string{"status", "audit"} {
		wantTargets = append(wantTargets, name+":"+httpPort(t, p.Services[name].Command))
	}
	slices.Sort(wantTargets)
	if !slices.Equal(slices.Sorted(slices.Values(targets)), wantTargets) {
		t.Errorf("prometheus.yml scrapes %v, want %v", targets, wantTargets)
	}

	// OTLP goes to the collector service, on a port it exposes and listens on.
	u, err := url.Parse(env(twins(p)[0], "OTEL_EXPORTER_OTLP_ENDPOINT"))
	if err != nil {
		t.Fatal(err)
	}
	col, ok := p.Services[u.Hostname()]
	if !ok || !slices.Contains([]string(col.Expose), u.Port()) {
		t.Errorf("OTEL_EXPORTER_OTLP_ENDPOINT %s: no compose service %s exposing %s", u, u.Hostname(), u.Port())
	}
	var cc struct {
		Receivers struct {
			OTLP struct {
				Protocols struct {
					GRPC struct {
						Endpoint string `json:"endpoint"`
					} `json:"grpc"`
				} `json:"protocols"`
			} `json:"otlp"`
		} `json:"receivers"`
	}
	if err := yaml.Unmarshal([]byte(readFile(t, "deploy/compose/otel-collector.yaml")), &cc); err != nil {
		t.Fatal(err)
	}
	if _, pt, err := net.SplitHostPort(cc.Receivers.OTLP.Protocols.GRPC.Endpoint); err != nil || pt != u.Port() {
		t.Errorf("the collector's OTLP gRPC receiver listens on %q, the twins send to port %s", cc.Receivers.OTLP.Protocols.GRPC.Endpoint, u.Port())
	}

	// Grafana: the provisioned datasource is the dashboard's, and points at compose's Prometheus.
	var ds struct {
		Datasources []struct {
			UID       string `json:"uid"`
			URL       string `json:"url"`
			Type      string `json:"type"`
			IsDefault bool   `json:"isDefault"`
		} `json:"datasources"`
	}
	if err := yaml.Unmarshal([]byte(readFile(t, "deploy/compose/grafana/provisioning/datasources/prometheus.yaml")), &ds); err != nil || len(ds.Datasources) != 1 {
		t.Fatalf("grafana datasource: %v %+v", err, ds)
	}
	// The dashboard reads the data source its variable selects, by default Grafana's default one:
	// the provisioned Prometheus must be it.
	if !ds.Datasources[0].IsDefault || ds.Datasources[0].Type != "prometheus" {
		t.Errorf("the provisioned datasource %s is not the default Prometheus the dashboard's variable selects", ds.Datasources[0].UID)
	}
	pu, err := url.Parse(ds.Datasources[0].URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := p.Services[pu.Hostname()]; !ok || pu.Port() != "9090" {
		t.Errorf("the datasource %s is not compose's Prometheus on 9090", pu)
	}
	var dp struct {
		Providers []struct {
			Options struct {
				Path string `json:"path"`
			} `json:"options"`
		} `json:"providers"`
	}
	if err := yaml.Unmarshal([]byte(readFile(t, "deploy/compose/grafana/provisioning/dashboards/baton.yaml")), &dp); err != nil || len(dp.Providers) != 1 {
		t.Fatalf("grafana dashboard provider: %v", err)
	}
	mounted := false
	for _, v := range p.Services["grafana"].Volumes {
		if v.Target == dp.Providers[0].Options.Path && strings.HasSuffix(v.Source, "grafana/dashboards") {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("grafana does not mount grafana/dashboards at the provider's path %s", dp.Providers[0].Options.Path)
	}
}

func TestEnvironmentAgrees(t *testing.T) {
	p, m, r := project(t), loadManifests(t), parseReadme(t)
	c := m.statefulSets[0].Spec.Template.Spec.Containers[0]
	cm := m.configMaps[0].Data

	// The member: the same variable names everywhere.
	k8s := map[string]string{}
	for k, v := range cm {
		k8s[k] = v
	}
	for _, e := range c.Env {
		if _, dup := k8s[e.Name]; dup {
			t.Errorf("k8s: %s is set by both the ConfigMap and env", e.Name)
		}
		k8s[e.Name] = e.Value
	}
	for _, s := range twins(p) {
		if got, want := slices.Sorted(maps.Keys(s.Environment)), slices.Sorted(maps.Keys(k8s)); !slices.Equal(got, want) {
			t.Errorf("compose %s sets %v, k8s sets %v", s.Name, got, want)
		}
	}
	if got, want := slices.Sorted(maps.Keys(r.memberEnv)), slices.Sorted(maps.Keys(k8s)); !slices.Equal(got, want) {
		t.Errorf("deploy/README.md documents %v, k8s sets %v", got, want)
	}
	// The same values, except the two that differ by design: the instance id and the URL.
	compose := twins(p)[0]
	for name, v := range k8s {
		switch name {
		case "BATON_INSTANCE_ID", "BATON_POSTGRES_URL":
			continue
		}
		if cv := env(compose, name); cv != v {
			t.Errorf("%s: compose %q, k8s %q", name, cv, v)
		}
		row := r.memberEnv[name]
		if want := single(row["compose"]); want != "" && want != v {
			t.Errorf("%s: deploy/README.md says %q, the manifests %q", name, want, v)
		}
		_, inCM := cm[name]
		if strings.Contains(row["k8s"], "ConfigMap `"+m.configMaps[0].Name+"`") != inCM {
			t.Errorf("%s: deploy/README.md's Kubernetes column %q disagrees with where k8s sets it", name, row["k8s"])
		}
	}
	appRef := secretRef(envVar(c.Env, "BATON_POSTGRES_URL"))
	if !strings.Contains(r.memberEnv["BATON_POSTGRES_URL"]["k8s"], "`"+strings.ReplaceAll(appRef, "/", "`/`")+"`") {
		t.Errorf("deploy/README.md does not name the member's Secret %s", appRef)
	}

	// The migration.
	mc := m.jobs[0].Spec.Template.Spec.Containers[0]
	mig := p.Services["migrate"]
	var jobEnv []string
	for _, e := range mc.Env {
		jobEnv = append(jobEnv, e.Name)
		if e.Value != "" && env(mig, e.Name) != e.Value {
			t.Errorf("migration %s: compose %q, k8s %q", e.Name, env(mig, e.Name), e.Value)
		}
	}
	slices.Sort(jobEnv)
	if got := slices.Sorted(maps.Keys(mig.Environment)); !slices.Equal(got, jobEnv) {
		t.Errorf("compose migrate sets %v, the Job %v", got, jobEnv)
	}
	if got := slices.Sorted(maps.Keys(r.migEnv)); !slices.Equal(got, jobEnv) {
		t.Errorf("deploy/README.md documents %v for the migration, the Job sets %v", got, jobEnv)
	}
	migRef := secretRef(envVar(mc.Env, "BATON_POSTGRES_URL"))
	if !strings.Contains(r.migEnv["BATON_POSTGRES_URL"]["k8s"], "`"+strings.ReplaceAll(migRef, "/", "`/`")+"`") {
		t.Errorf("deploy/README.md does not name the migration's Secret %s", migRef)
	}
	// Compose's URLs use the roles the README and roles.sh name.
	roles := readFile(t, "deploy/compose/postgres/roles.sh")
	for svc, role := range map[string]string{"twin-1": "baton_app", "migrate": "baton_migrate"} {
		u, err := url.Parse(env(p.Services[svc], "BATON_POSTGRES_URL"))
		if err != nil || u.User.Username() != role || !strings.Contains(roles, "CREATE ROLE "+role+" ") {
			t.Errorf("compose %s connects as %v, want the role %s created by roles.sh (%v)", svc, u, role, err)
		}
	}
}

func TestLimitsAgree(t *testing.T) {
	p, m := project(t), loadManifests(t)
	pod := m.statefulSets[0].Spec.Template.Spec
	grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
	lim := pod.Containers[0].Resources.Limits.Memory()
	for _, s := range twins(p) {
		if s.StopGracePeriod == nil || time.Duration(*s.StopGracePeriod) != grace {
			t.Errorf("compose %s: stop_grace_period %v, k8s terminationGracePeriodSeconds %v", s.Name, s.StopGracePeriod, grace)
		}
		if got := resource.NewQuantity(int64(s.MemLimit), resource.BinarySI); got.Cmp(*lim) != 0 {
			t.Errorf("compose %s: mem_limit %v, k8s memory limit %v", s.Name, got, lim)
		}
	}
	if s := fmt.Sprint(grace); !strings.Contains(readFile(t, "deploy/README.md"), fmt.Sprintf("terminationGracePeriodSeconds: %d", int(grace.Seconds()))) {
		t.Errorf("deploy/README.md does not state the grace period %s", s)
	}
}
