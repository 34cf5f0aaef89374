// Package deploytest validates deploy/compose, deploy/k8s and deploy/README.md without a
// container engine or a cluster. It is its own module (like fence/lease/k8slease) and holds
// tests only: the Kubernetes API types, the compose spec's loader and the Prometheus exporter
// stay out of Baton's go.mod, so no user of the library downloads or compiles them. It imports
// no Baton package; it reads the repository's files ("cd internal/deploytest && go test ./...").
//
// What the tests prove:
//   - every manifest in deploy/k8s decodes strictly (unknown or duplicate fields rejected) into
//     the real Kubernetes API types (k8s.io/api; the ServiceMonitor into the Prometheus
//     Operator's), and the objects fit together: selectors,
//     named ports, probes, the Secrets they reference, the grace period against the revoke
//     barrier's budget, the resources against the measured RSS;
//   - deploy/compose/compose.yaml loads with the compose spec's own loader and schema
//     (github.com/compose-spec/compose-go/v2);
//   - every Grafana query parses (Prometheus's own PromQL parser) and every series and label it
//     reads is one Baton emits: the instruments are read from the packages' doc.go and source,
//     and named by the real OpenTelemetry Prometheus exporter;
//   - the image, the port and the environment agree across compose, k8s, the Dockerfile,
//     prometheus.yml and deploy/README.md; every image is pinned; the status page and the
//     auditor run the same command lines in compose and k8s;
//   - every rules file in deploy/prometheus decodes as Prometheus decodes it, reads only series
//     and labels the programs export, and passes 'promtool check rules';
//   - every program and deployment file uses one environment variable name per setting.
//   - every command line they run parses with the program's real flags (examples/twin/usage.txt,
//     which is `twin -h`): the members run -serve on the container's port, the migration
//     -migrate, every BATON_* variable set is one the program reads, and the probes' and
//     Prometheus's paths are ones -serve serves.
//
// What they cannot prove: that an image builds, that a container starts, that a cluster admits
// the objects (admission, quotas, API server validation beyond the types) or that the stack
// works end to end. Nothing here runs Docker or Kubernetes.
package deploytest
