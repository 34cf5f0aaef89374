package chaos_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/batonhq/baton/fence/pgfence"
	"github.com/batonhq/baton/internal/operator/chaos"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/outbox/pgoutbox"
)

// TestChaosSecure is a bounded chaos run with every service secured: the workers and the
// gateway reach Kafka over SASL_SSL (SCRAM-SHA-512, mutual TLS) as the runtime principal, which
// holds only ACLs on the run's topics and groups, and PostgreSQL over verify-full as the runtime
// role, which holds only the stores' RuntimeGrants and DML on the workload's tables; the harness
// is the admin. Freezes, a kill and a group deletion (whose recovery appends to the recoveries
// table as the runtime role) must leave every invariant holding, and no password may appear in
// the workers' logs or the run's output.
func TestChaosSecure(t *testing.T) {
	ke := testenv.SecureKafka(t)
	sp := testenv.SecurePostgres(t)
	ctx := testenv.Context(t, 15*time.Minute)
	admin := chaos.PgDB(sp.Admin)
	var grants []string
	adminFences := must(pgfence.New(sp.Admin))
	for _, m := range []interface {
		Migrate(context.Context) error
		RuntimeGrants(string) ([]string, error)
	}{adminFences, must(pgoutbox.New(sp.Admin, adminFences))} {
		if err := m.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		grants = append(grants, must(m.RuntimeGrants(sp.RuntimeRole))...)
	}
	if err := chaos.Migrate(ctx, admin); err != nil {
		t.Fatal(err)
	}
	r := sp.RuntimeRole
	sp.Grant(t, append(grants,
		"GRANT SELECT, INSERT, UPDATE ON chaos_state, chaos_applied, chaos_attempts, chaos_commands TO "+r,
		"GRANT USAGE ON SEQUENCE chaos_applied_id_seq, chaos_attempts_id_seq, chaos_commands_id_seq TO "+r))

	group, topic := testenv.UniqueName("chaos_g"), testenv.UniqueName("chaos_t")
	// The topic and its commands topic; the group and its gateway's group.
	ke.GrantPrefixed(t, kadm.NewACLs().Topics(topic), kadm.OpRead, kadm.OpWrite, kadm.OpDescribe)
	ke.GrantPrefixed(t, kadm.NewACLs().Groups(group), kadm.OpRead, kadm.OpDescribe)
	deploy, err := filepath.Abs("../../../deploy/local")
	if err != nil {
		t.Fatal(err)
	}
	logDir := t.TempDir()
	var progress bytes.Buffer
	cfg := chaos.Config{
		Mode: chaos.Fenced, Workers: 3, Partitions: 6,
		Workload: chaos.Workload{Keys: 60, PerKey: 10, CommandEvery: 4}, Rate: 400,
		Faults: []chaos.FaultKind{chaos.FaultFreeze, chaos.FaultKill, chaos.FaultGroupDelete}, NumFaults: 3, Seed: 7,
		Group: group, Topic: topic,
		Brokers: ke.Brokers, Kafka: ke.AdminOpts(t)[1:], WorkerKafka: ke.Runtime,
		PostgresURL: sp.RuntimeURL, Binary: binary(t), DeployDir: deploy, LogDir: logDir,
		Progress: &progress, Settle: 2 * time.Minute,
	}
	res, err := chaos.Run(ctx, cfg, admin)
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatalf("chaos run: %v", err)
	}
	var verdict bytes.Buffer
	chaos.WriteVerdict(&verdict, res)
	t.Logf("verdict:\n%s", verdict.String())
	if !res.OK() {
		t.Errorf("invariants violated: %v (settled %v)", res.Verdict.Violations(), res.Settled)
	}
	if res.Verdict.ZombieCommitted != 0 {
		t.Errorf("%d zombie writes committed", res.Verdict.ZombieCommitted)
	}
	for _, f := range res.Faults {
		if !f.Bit && f.Kind != chaos.FaultFreeze {
			t.Errorf("fault %s on %s did not happen: %s", f.Kind, f.Target, f.Detail)
		}
	}
	// The workers' logs, the progress and the verdict hold no password.
	secrets := testenv.Secrets(t)
	out := progress.String() + verdict.String()
	files, _ := filepath.Glob(filepath.Join(logDir, "*"))
	if len(files) == 0 {
		t.Error("no worker log to check")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out += string(b)
	}
	testenv.NoSecrets(t, "the workers' logs and the run's output", out, secrets)
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
