package deploytest

import (
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// httpPort returns the port of the -http flag in a baton command line ("" if none).
func httpPort(t *testing.T, args []string) string {
	t.Helper()
	i := slices.Index(args, "-http")
	if i < 0 || i+1 >= len(args) {
		t.Errorf("%v has no -http ADDR", args)
		return ""
	}
	_, port, err := net.SplitHostPort(args[i+1])
	if err != nil {
		t.Errorf("%v: -http %q: %v", args, args[i+1], err)
	}
	return port
}

// operatorCommands are the baton commands the deployments run beside the members.
var operatorCommands = map[string]string{"baton-status": "status", "baton-audit": "audit"}

// TestOperatorProcesses: 'baton status -http' and 'baton audit -http' run as Deployments with a
// Service each, and as compose services, from the members' image, on the port their -http
// names, with only the variables every program reads (the brokers and group from the members'
// ConfigMap, the store from the runtime role's Secret); one ServiceMonitor scrapes /metrics on
// every Baton Service.
func TestOperatorProcesses(t *testing.T) {
	m, p, r := loadManifests(t), project(t), parseReadme(t)
	cm := m.configMaps[0]
	for name, cmd := range operatorCommands {
		d := m.deployment(t, name)
		pod := d.Spec.Template
		if !selectorMatches(t, d.Spec.Selector, pod.Labels) {
			t.Errorf("%s: the selector does not match the pod labels", name)
		}
		if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
			t.Errorf("%s: replicas %v, want 1", name, d.Spec.Replicas)
		}
		if len(pod.Spec.Containers) != 1 {
			t.Fatalf("%s: %d containers", name, len(pod.Spec.Containers))
		}
		c := pod.Spec.Containers[0]
		if c.Image != r.image {
			t.Errorf("%s runs %s, the members %s", name, c.Image, r.image)
		}
		if len(c.Args) < 2 || c.Args[0] != "baton" || c.Args[1] != cmd {
			t.Errorf("%s runs %v, want baton %s", name, c.Args, cmd)
		}
		port, ok := containerPort(c, "http")
		if !ok || httpPort(t, c.Args) != itoa(port) {
			t.Errorf("%s: -http in %v and the container's http port %d differ", name, c.Args, port)
		}
		for _, pr := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
			if pr == nil || pr.HTTPGet == nil || pr.HTTPGet.Path != "/metrics" || pr.HTTPGet.Port.String() != "http" {
				t.Errorf("%s: want readiness and liveness probes on GET /metrics, got %+v", name, pr)
			}
		}
		envs := map[string]bool{}
		for _, e := range c.Env {
			envs[e.Name] = true
			if !slices.Contains(mapValues(sharedEnv), e.Name) {
				t.Errorf("%s sets %s, which is not one of the names every program reads", name, e.Name)
			}
			if ref := e.ValueFrom; ref != nil && ref.ConfigMapKeyRef != nil {
				if _, ok := cm.Data[ref.ConfigMapKeyRef.Key]; ref.ConfigMapKeyRef.Name != cm.Name || !ok {
					t.Errorf("%s: %s refers to %s/%s, which the ConfigMap does not hold", name, e.Name, ref.ConfigMapKeyRef.Name, ref.ConfigMapKeyRef.Key)
				}
			}
		}
		for _, want := range []string{"BATON_KAFKA_BROKERS", "BATON_GROUP", "BATON_POSTGRES_URL"} {
			if !envs[want] {
				t.Errorf("%s does not set %s", name, want)
			}
		}
		if secretRef(envVar(c.Env, "BATON_POSTGRES_URL")) != secretRef(envVar(m.statefulSets[0].Spec.Template.Spec.Containers[0].Env, "BATON_POSTGRES_URL")) {
			t.Errorf("%s must read the store as the members' runtime role", name)
		}
		if ps := pod.Spec; ps.SecurityContext == nil || ps.SecurityContext.RunAsNonRoot == nil || !*ps.SecurityContext.RunAsNonRoot ||
			ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
			t.Errorf("%s: want non-root and no service account token", name)
		}
		svc := m.service(t, name)
		if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(pod.Labels)) || len(svc.Spec.Ports) != 1 ||
			svc.Spec.Ports[0].Name != "http" || svc.Spec.Ports[0].TargetPort.String() != "http" {
			t.Errorf("%s: the Service %+v does not serve the pod's http port", name, svc.Spec)
		}

		// Compose runs the same command line with the same variables.
		cs, ok := p.Services[cmd]
		if !ok {
			t.Errorf("compose has no service %s", cmd)
			continue
		}
		if !slices.Equal([]string(cs.Command), c.Args) {
			t.Errorf("compose %s runs %v, k8s %v", cmd, cs.Command, c.Args)
		}
		if cs.Image != r.image {
			t.Errorf("compose %s runs %s, the members %s", cmd, cs.Image, r.image)
		}
		var kv []string
		for k := range cs.Environment {
			kv = append(kv, k)
		}
		var ke []string
		for _, e := range c.Env {
			ke = append(ke, e.Name)
		}
		if !slices.Equal(slices.Sorted(slices.Values(kv)), slices.Sorted(slices.Values(ke))) {
			t.Errorf("compose %s sets %v, k8s %v", cmd, slices.Sorted(slices.Values(kv)), slices.Sorted(slices.Values(ke)))
		}
		for _, k := range []string{"BATON_KAFKA_BROKERS", "BATON_GROUP"} {
			if env(cs, k) != env(twins(p)[0], k) {
				t.Errorf("compose %s: %s %q, the members %q", cmd, k, env(cs, k), env(twins(p)[0], k))
			}
		}
	}
	// The ServiceMonitor selects the members', the page's and the auditor's Services.
	sm := m.monitors[0]
	sel := labels.SelectorFromSet(sm.Spec.Selector.MatchLabels)
	for _, name := range []string{"twin", "baton-status", "baton-audit"} {
		if !sel.Matches(labels.Set(m.service(t, name).Labels)) || len(sm.Spec.Selector.MatchLabels) == 0 {
			t.Errorf("the ServiceMonitor does not select the Service %s", name)
		}
	}
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "http" || sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Errorf("the ServiceMonitor's endpoints %+v: want /metrics on the port named http", sm.Spec.Endpoints)
	}
	// Compose's Prometheus loads every rules file, from where compose mounts them.
	var prom struct {
		RuleFiles []string `json:"rule_files"`
	}
	if err := yaml.Unmarshal([]byte(readFile(t, "deploy/compose/prometheus.yml")), &prom); err != nil {
		t.Fatal(err)
	}
	mount := ""
	for _, v := range p.Services["prometheus"].Volumes {
		if strings.HasSuffix(v.Source, "deploy/prometheus") {
			mount = v.Target
		}
	}
	for _, f := range []string{opsRulesFile, auditRulesFile} {
		if mount == "" || !slices.Contains(prom.RuleFiles, mount+"/"+f[strings.LastIndex(f, "/")+1:]) {
			t.Errorf("compose's Prometheus does not load %s (rule_files %v, deploy/prometheus mounted at %q)", f, prom.RuleFiles, mount)
		}
	}
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }

func mapValues(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

var (
	pinnedTag    = regexp.MustCompile(`^[^@]+:v?\d+(\.\d+)+$`)
	pinnedDigest = regexp.MustCompile(`^[^@]+@sha256:[0-9a-f]{64}$`)
)

// TestImagesPinned: every image compose and k8s run has a version tag or a digest (no :dev, no
// :latest, no tag), and the migration Job's name carries the members' version, so that each
// upgrade runs a Job of its own (a Job's pod template cannot change) and re-applying one is a
// no-op.
func TestImagesPinned(t *testing.T) {
	m, p := loadManifests(t), project(t)
	imgs := map[string]string{}
	for _, s := range p.Services {
		imgs["compose "+s.Name] = s.Image
	}
	for _, s := range m.statefulSets {
		imgs["k8s "+s.Name] = s.Spec.Template.Spec.Containers[0].Image
	}
	for _, d := range m.deployments {
		imgs["k8s "+d.Name] = d.Spec.Template.Spec.Containers[0].Image
	}
	for _, j := range m.jobs {
		imgs["k8s "+j.Name] = j.Spec.Template.Spec.Containers[0].Image
	}
	for where, img := range imgs {
		if !pinnedTag.MatchString(img) && !pinnedDigest.MatchString(img) {
			t.Errorf("%s runs %q: pin a version tag or a digest", where, img)
		}
	}
	twin := m.statefulSets[0].Spec.Template.Spec.Containers[0].Image
	version := strings.ReplaceAll(strings.TrimPrefix(twin[strings.LastIndex(twin, ":")+1:], "v"), ".", "-")
	if job := m.jobs[0].Name; !strings.HasSuffix(job, "-"+version) {
		t.Errorf("the migration Job %s is not named after the image's version %s", job, version)
	}
	if !strings.Contains(readFile(t, "deploy/README.md"), "job/"+m.jobs[0].Name) {
		t.Errorf("deploy/README.md does not wait for job/%s", m.jobs[0].Name)
	}
	if ttl := m.jobs[0].Spec.TTLSecondsAfterFinished; ttl == nil || *ttl <= 0 {
		t.Error("the migration Job needs ttlSecondsAfterFinished: finished Jobs of earlier versions go away")
	}
}

// TestComposeKafkaReachableFromHost: compose's broker advertises, on the port it publishes to
// the host, an address the host can reach (localhost), and the compose network's address on
// the listener the members use.
func TestComposeKafkaReachableFromHost(t *testing.T) {
	p := project(t)
	k := p.Services["kafka"]
	adv := map[string]string{} // listener name -> host:port
	for _, l := range strings.Split(env(k, "KAFKA_ADVERTISED_LISTENERS"), ",") {
		name, addr, _ := strings.Cut(l, "://")
		adv[name] = addr
	}
	published := map[string]bool{}
	for _, pc := range k.Ports {
		published[pc.Published] = pc.Target == mustAtoi(t, pc.Published)
	}
	host := ""
	for name, addr := range adv {
		h, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatalf("advertised listener %s=%s: %v", name, addr, err)
		}
		if published[port] {
			if h != "localhost" && h != "127.0.0.1" {
				t.Errorf("listener %s is published on the host's port %s but advertises %s, which the host cannot resolve", name, port, h)
			}
			host = addr
		}
	}
	if host == "" {
		t.Errorf("no advertised listener is published to the host (ports %+v, advertised %v)", k.Ports, adv)
	}
	if b := env(twins(p)[0], "BATON_KAFKA_BROKERS"); !slices.Contains(mapValues(adv), b) {
		t.Errorf("the members' brokers %s are not an advertised listener %v", b, adv)
	}
	var names []string
	for _, l := range strings.Split(env(k, "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"), ",") {
		n, _, _ := strings.Cut(l, ":")
		names = append(names, n)
	}
	for name := range adv {
		if !slices.Contains(names, name) {
			t.Errorf("listener %s has no security protocol", name)
		}
	}
}

func mustAtoi(t *testing.T, s string) uint32 {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("port %q: %v", s, err)
	}
	return uint32(n)
}
