package deploytest

import (
	"bytes"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// The shutdown budget deploy/README.md derives ("Shutdown"): the revoke barrier's in-flight
// batch, its offset commit, and the telemetry flush.
const (
	budgetInflightBatch = 15 * time.Second
	budgetOffsetCommit  = 10 * time.Second // franz-go's RequestTimeoutOverhead default
	budgetOTLPFlush     = 5 * time.Second  // OTEL_EXPORTER_OTLP_TIMEOUT
	shutdownBudget      = budgetInflightBatch + budgetOffsetCommit + budgetOTLPFlush
)

// measuredRSS is the highest resident set size measured for one member (deploy/README.md,
// "Resources": 'twin -serve' on the real Kafka and PostgreSQL, peak VmRSS 42676 kB).
var measuredRSS = resource.MustParse("42676Ki")

// manifests holds every object of deploy/k8s, decoded strictly into its API type.
type manifests struct {
	configMaps   []*corev1.ConfigMap
	services     []*corev1.Service
	statefulSets []*appsv1.StatefulSet
	pdbs         []*policyv1.PodDisruptionBudget
	jobs         []*batchv1.Job
	deployments  []*appsv1.Deployment
	monitors     []*monitoringv1.ServiceMonitor
	raw          map[string][]byte // file -> content
}

// service returns the Service named name.
func (m *manifests) service(t *testing.T, name string) *corev1.Service {
	t.Helper()
	for _, s := range m.services {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("deploy/k8s has no Service %s", name)
	return nil
}

// deployment returns the Deployment named name.
func (m *manifests) deployment(t *testing.T, name string) *appsv1.Deployment {
	t.Helper()
	for _, d := range m.deployments {
		if d.Name == name {
			return d
		}
	}
	t.Fatalf("deploy/k8s has no Deployment %s", name)
	return nil
}

// splitDocs splits a YAML stream into its documents, dropping empty ones.
func splitDocs(b []byte) [][]byte {
	var docs [][]byte
	for d := range bytes.SplitSeq(b, []byte("\n---")) {
		d = bytes.TrimPrefix(d, []byte("---"))
		empty := true
		for l := range strings.SplitSeq(string(d), "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				empty = false
			}
		}
		if !empty {
			docs = append(docs, d)
		}
	}
	return docs
}

// decodeStrict decodes one YAML document into the API type its apiVersion and kind name.
// sigs.k8s.io/yaml's UnmarshalStrict rejects unknown and duplicate fields.
func decodeStrict(doc []byte) (any, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return nil, err
	}
	var obj any
	switch tm.APIVersion + "/" + tm.Kind {
	case "v1/ConfigMap":
		obj = &corev1.ConfigMap{}
	case "v1/Service":
		obj = &corev1.Service{}
	case "apps/v1/StatefulSet":
		obj = &appsv1.StatefulSet{}
	case "policy/v1/PodDisruptionBudget":
		obj = &policyv1.PodDisruptionBudget{}
	case "batch/v1/Job":
		obj = &batchv1.Job{}
	case "apps/v1/Deployment":
		obj = &appsv1.Deployment{}
	case "monitoring.coreos.com/v1/ServiceMonitor":
		obj = &monitoringv1.ServiceMonitor{}
	default:
		// A Secret is refused too: secrets are referenced, never shipped.
		return nil, fmt.Errorf("unexpected object %s %s", tm.APIVersion, tm.Kind)
	}
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return nil, err
	}
	return obj, nil
}

func loadManifests(t *testing.T) *manifests {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "deploy/k8s/*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in deploy/k8s (%v)", err)
	}
	m := &manifests{raw: map[string][]byte{}}
	for _, f := range files {
		b := []byte(readFile(t, filepath.Join("deploy/k8s", filepath.Base(f))))
		m.raw[filepath.Base(f)] = b
		for i, doc := range splitDocs(b) {
			obj, err := decodeStrict(doc)
			if err != nil {
				t.Fatalf("%s, document %d: %v", filepath.Base(f), i+1, err)
			}
			switch o := obj.(type) {
			case *corev1.ConfigMap:
				m.configMaps = append(m.configMaps, o)
			case *corev1.Service:
				m.services = append(m.services, o)
			case *appsv1.StatefulSet:
				m.statefulSets = append(m.statefulSets, o)
			case *policyv1.PodDisruptionBudget:
				m.pdbs = append(m.pdbs, o)
			case *batchv1.Job:
				m.jobs = append(m.jobs, o)
			case *appsv1.Deployment:
				m.deployments = append(m.deployments, o)
			case *monitoringv1.ServiceMonitor:
				m.monitors = append(m.monitors, o)
			}
		}
	}
	if len(m.statefulSets) != 1 || len(m.services) != 3 || len(m.pdbs) != 1 || len(m.jobs) != 1 || len(m.configMaps) != 1 ||
		len(m.deployments) != 2 || len(m.monitors) != 1 {
		t.Fatalf("want one each of StatefulSet, PodDisruptionBudget, Job, ConfigMap and ServiceMonitor, three Services and two Deployments; got %d, %d, %d, %d, %d, %d, %d",
			len(m.statefulSets), len(m.pdbs), len(m.jobs), len(m.configMaps), len(m.monitors), len(m.services), len(m.deployments))
	}
	return m
}

// TestStrictDecodingRejects proves the decoder is strict: a misspelt field, a field at the
// wrong level and a duplicate key each fail, and so does a Secret.
func TestStrictDecodingRejects(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown field":                 "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndatta: {a: b}\n",
		"wrong level":                   "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: x}\nmaxUnavailable: 1\n",
		"duplicate key":                 "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: b}\ndata: {c: d}\n",
		"bad quantity":                  "apiVersion: batch/v1\nkind: Job\nmetadata: {name: x}\nspec:\n  template:\n    spec:\n      containers: [{name: c, resources: {requests: {memory: 64 MiB}}}]\n",
		"a Secret":                      "apiVersion: v1\nkind: Secret\nmetadata: {name: x}\nstringData: {url: postgres://u:p@h/db}\n",
		"ServiceMonitor, unknown field": "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: x}\nspec:\n  selector: {}\n  endpoints: [{port: http, paths: /metrics}]\n",
		"Deployment, wrong level":       "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replicas: 1\n  containers: []\n",
	} {
		if _, err := decodeStrict([]byte(doc)); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
	if _, err := decodeStrict([]byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: b}\n")); err != nil {
		t.Errorf("a valid ConfigMap: %v", err)
	}
}

func selectorMatches(t *testing.T, sel *metav1.LabelSelector, podLabels map[string]string) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatal(err)
	}
	return !s.Empty() && s.Matches(labels.Set(podLabels))
}

func containerPort(c corev1.Container, name string) (int32, bool) {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort, true
		}
	}
	return 0, false
}

func TestKubernetesManifests(t *testing.T) {
	m := loadManifests(t)
	sts, svc, pdb, job, cm := m.statefulSets[0], m.service(t, "twin"), m.pdbs[0], m.jobs[0], m.configMaps[0]
	pod := sts.Spec.Template
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("the twin pod has %d containers, want 1", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]

	// Identity: a headless governing Service and group.instance.id from the pod name.
	if sts.Spec.ServiceName != svc.Name || svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("StatefulSet serviceName %q: want the headless Service %q", sts.Spec.ServiceName, svc.Name)
	}
	if !selectorMatches(t, sts.Spec.Selector, pod.Labels) {
		t.Errorf("the StatefulSet's selector does not match its pod labels %v", pod.Labels)
	}
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(pod.Labels)) || len(svc.Spec.Selector) == 0 {
		t.Errorf("the Service's selector %v does not match the pod labels", svc.Spec.Selector)
	}
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 3 {
		t.Errorf("replicas %v, want 3", sts.Spec.Replicas)
	}
	id := envVar(c.Env, "BATON_INSTANCE_ID")
	if id == nil || id.ValueFrom == nil || id.ValueFrom.FieldRef == nil || id.ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("BATON_INSTANCE_ID must come from the pod name (fieldRef metadata.name), got %+v", id)
	}

	// Shutdown: the grace period covers the revoke barrier's budget.
	grace := pod.Spec.TerminationGracePeriodSeconds
	if grace == nil || time.Duration(*grace)*time.Second <= shutdownBudget {
		t.Errorf("terminationGracePeriodSeconds %v must exceed the %v shutdown budget", grace, shutdownBudget)
	}
	if !strings.Contains(readFile(t, "deploy/README.md"), fmt.Sprintf("**%d s**", int(shutdownBudget.Seconds()))) {
		t.Errorf("deploy/README.md does not state the %v shutdown budget", shutdownBudget)
	}

	// Probes: readiness is "joined and claimed" (/readyz), liveness /healthz, on the http port.
	http, ok := containerPort(c, "http")
	if !ok {
		t.Fatal("the twin container declares no port named http")
	}
	for _, p := range []struct {
		what  string
		probe *corev1.Probe
		path  string
	}{{"readiness", c.ReadinessProbe, "/readyz"}, {"liveness", c.LivenessProbe, "/healthz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s probe: want an httpGet", p.what)
			continue
		}
		if p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "http" {
			t.Errorf("%s probe: GET %s on %s, want %s on the http port", p.what, p.probe.HTTPGet.Path, p.probe.HTTPGet.Port.String(), p.path)
		}
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != http || svc.Spec.Ports[0].TargetPort.String() != "http" {
		t.Errorf("Service ports %+v: want one port %d targeting http", svc.Spec.Ports, http)
	}

	// Resources: the request covers the measured RSS twice; GOMEMLIMIT sits below the limit.
	req, lim := c.Resources.Requests.Memory(), c.Resources.Limits.Memory()
	if twice := measuredRSS.DeepCopy(); true {
		twice.Add(measuredRSS)
		if req.Cmp(twice) < 0 {
			t.Errorf("memory request %v is below twice the measured RSS (%v)", req, measuredRSS.String())
		}
	}
	if lim.IsZero() || lim.Cmp(*req) <= 0 {
		t.Errorf("memory limit %v must be set and above the request %v", lim, req)
	}
	if _, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
		t.Error("no CPU limit: throttling delays heartbeats")
	}
	if c.Resources.Requests.Cpu().IsZero() {
		t.Error("no CPU request")
	}
	gml := envVar(c.Env, "GOMEMLIMIT")
	if gml == nil {
		t.Fatal("GOMEMLIMIT not set")
	}
	q, err := resource.ParseQuantity(strings.TrimSuffix(gml.Value, "B"))
	if err != nil || q.Cmp(*lim) >= 0 {
		t.Errorf("GOMEMLIMIT %q must parse and be below the memory limit %v (%v)", gml.Value, lim, err)
	}

	// PodDisruptionBudget: one voluntary disruption at a time, over the twin pods.
	if !selectorMatches(t, pdb.Spec.Selector, pod.Labels) {
		t.Error("the PodDisruptionBudget's selector does not match the twin pods")
	}
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.String() != "1" {
		t.Errorf("PDB maxUnavailable %v, want 1", pdb.Spec.MaxUnavailable)
	}
	if selectorMatches(t, pdb.Spec.Selector, job.Spec.Template.Labels) {
		t.Error("the PodDisruptionBudget must not cover the migration Job's pod")
	}

	// The migration Job: the migration role's Secret, not the runtime one; never restarted in place.
	jc := job.Spec.Template.Spec.Containers
	if len(jc) != 1 {
		t.Fatalf("the migration Job has %d containers, want 1", len(jc))
	}
	if job.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyNever || job.Spec.BackoffLimit == nil || job.Spec.ActiveDeadlineSeconds == nil {
		t.Error("the migration Job needs restartPolicy Never, a backoffLimit and an activeDeadlineSeconds")
	}
	// Its command line is checked against the program's flags in program_test.go.
	appRef, migRef := secretRef(envVar(c.Env, "BATON_POSTGRES_URL")), secretRef(envVar(jc[0].Env, "BATON_POSTGRES_URL"))
	if appRef == "" || migRef == "" || appRef == migRef {
		t.Errorf("BATON_POSTGRES_URL: the member (%q) and the migration (%q) must each use its own role's Secret", appRef, migRef)
	}

	// envFrom names the ConfigMap that exists.
	if len(c.EnvFrom) != 1 || c.EnvFrom[0].ConfigMapRef == nil || c.EnvFrom[0].ConfigMapRef.Name != cm.Name {
		t.Errorf("envFrom %+v: want the ConfigMap %q", c.EnvFrom, cm.Name)
	}

	// Hardening both pods share.
	for _, ps := range []corev1.PodSpec{pod.Spec, job.Spec.Template.Spec} {
		if ps.SecurityContext == nil || ps.SecurityContext.RunAsNonRoot == nil || !*ps.SecurityContext.RunAsNonRoot {
			t.Error("a pod must run as non-root")
		}
		if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
			t.Error("a pod must not mount a service account token (it talks to no API server)")
		}
	}
}

// TestNoInlineSecrets: every variable that can hold a credential comes from a secretKeyRef,
// no ConfigMap key looks like one, and no value anywhere embeds user:password@.
func TestNoInlineSecrets(t *testing.T) {
	m := loadManifests(t)
	credential := regexp.MustCompile(`(?i)(PASSWORD|SECRET|TOKEN|_URL$|DSN|CREDENTIAL)`)
	userinfo := regexp.MustCompile(`://[^/\s:@]+:[^/\s@]+@`)
	var containers []corev1.Container
	containers = append(containers, m.statefulSets[0].Spec.Template.Spec.Containers...)
	containers = append(containers, m.jobs[0].Spec.Template.Spec.Containers...)
	for _, d := range m.deployments {
		containers = append(containers, d.Spec.Template.Spec.Containers...)
	}
	refs := 0
	for _, c := range containers {
		for _, e := range c.Env {
			if !credential.MatchString(e.Name) {
				continue
			}
			if secretRef(&e) == "" {
				t.Errorf("%s: %s must come from a secretKeyRef", c.Name, e.Name)
			}
			refs++
		}
	}
	if refs < 2 {
		t.Errorf("found %d secret references, want the member's and the migration's", refs)
	}
	for k := range m.configMaps[0].Data {
		if credential.MatchString(k) {
			t.Errorf("ConfigMap key %s looks like a credential: reference a Secret instead", k)
		}
	}
	for f, b := range m.raw {
		if userinfo.Match(b) {
			t.Errorf("%s embeds a user:password@ URL", f)
		}
	}
}

func envVar(env []corev1.EnvVar, name string) *corev1.EnvVar {
	for i := range env {
		if env[i].Name == name {
			return &env[i]
		}
	}
	return nil
}

// secretRef returns "secret/key" when e comes from a secretKeyRef, else "".
func secretRef(e *corev1.EnvVar) string {
	if e == nil || e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
		return ""
	}
	return e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
}
