package sqlident

import (
	"errors"
	"strings"
	"testing"
)

func TestGrants(t *testing.T) {
	got, err := Grants("rt", []TableGrant{{"s.a", "SELECT"}, {"s.b", "SELECT, INSERT"}, {"c", "UPDATE"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`GRANT USAGE ON SCHEMA "s" TO "rt"`, `GRANT SELECT ON TABLE "s"."a" TO "rt"`,
		`GRANT SELECT, INSERT ON TABLE "s"."b" TO "rt"`, `GRANT UPDATE ON TABLE "c" TO "rt"`}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	_, err = Grants("a.b", []TableGrant{{"x;drop", "SELECT"}})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "role") || !strings.Contains(err.Error(), "x;drop") {
		t.Fatalf("bad role and table: %v, want both reported", err)
	}
}
