package status

import (
	"bytes"
	"strings"
	"testing"
)

// TestSchemaPrintsRuntimeGrants: 'baton schema -runtime-role' prints the stores' least-privilege
// GRANTs after the DDL for PostgreSQL: no DDL rights, no TRUNCATE, recoveries append-only.
func TestSchemaPrintsRuntimeGrants(t *testing.T) {
	var b bytes.Buffer
	if err := Schema(&b, Postgres, Tables{}, "app_rt"); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	ddl, grants, ok := strings.Cut(out, "-- Least-privilege runtime role app_rt")
	if !ok {
		t.Fatalf("no grants section in:\n%s", out)
	}
	if !strings.Contains(ddl, "CREATE TABLE") {
		t.Errorf("the DDL does not come before the grants:\n%s", out)
	}
	for _, want := range []string{
		`GRANT SELECT, INSERT, UPDATE ON TABLE "baton_fences" TO "app_rt";`,
		`GRANT SELECT, INSERT ON TABLE "baton_fences_recoveries" TO "app_rt";`,
		`ON TABLE "baton_outbox_cursors" TO "app_rt";`,
	} {
		if !strings.Contains(grants, want) {
			t.Errorf("missing %q in:\n%s", want, grants)
		}
	}
	var stmts []string
	for _, l := range strings.Split(grants, "\n") {
		if strings.HasPrefix(l, "GRANT ") {
			stmts = append(stmts, l)
		}
	}
	if len(stmts) < 5 {
		t.Fatalf("%d GRANT statements, want one per table:\n%s", len(stmts), grants)
	}
	for _, st := range stmts {
		for _, bad := range []string{"TRUNCATE", "ALTER", "DROP", "CREATE", "ALL"} {
			if strings.Contains(st, bad) {
				t.Errorf("the runtime role's grant %q contains %s", st, bad)
			}
		}
	}
	b.Reset()
	if err := Schema(&b, SQLite, Tables{}, "app_rt"); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "GRANT") {
		t.Errorf("SQLite has no roles, yet GRANTs were printed:\n%s", b.String())
	}
}
