package occsql

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/batonhq/baton/fence"
)

func pg(i int) string { return "$" + strconv.Itoa(i) }

// TestStatements pins the statements: the compare and the increment are one UPDATE, names are
// quoted, and the arguments line up with their placeholders.
func TestStatements(t *testing.T) {
	tb, err := New("test", "s.Orders", "id", "version")
	if err != nil {
		t.Fatal(err)
	}
	set := []fence.Column{{Name: "status", Value: "RELEASED"}, {Name: "note", Value: "n"}}
	sql, args := tb.Update(pg, 4711, 12, set)
	if want := `UPDATE "s"."Orders" SET "status" = $3, "note" = $4, "version" = "version" + 1 WHERE "id" = $1 AND "version" = $2 RETURNING "version"`; sql != want {
		t.Errorf("Update:\n got %s\nwant %s", sql, want)
	}
	if want := []any{4711, int64(12), "RELEASED", "n"}; !slices.Equal(args, want) {
		t.Errorf("Update args = %v, want %v", args, want)
	}
	sql, args = tb.Insert(pg, 4711, set)
	if want := `INSERT INTO "s"."Orders" ("id", "status", "note", "version") VALUES ($1, $2, $3, 1) ON CONFLICT ("id") DO NOTHING RETURNING "version"`; sql != want {
		t.Errorf("Insert:\n got %s\nwant %s", sql, want)
	}
	if want := []any{4711, "RELEASED", "n"}; !slices.Equal(args, want) {
		t.Errorf("Insert args = %v, want %v", args, want)
	}
	if got, want := tb.Select(pg), `SELECT "version" FROM "s"."Orders" WHERE "id" = $1`; got != want {
		t.Errorf("Select = %s, want %s", got, want)
	}
}

func TestNewAndCheckRefuse(t *testing.T) {
	if _, err := New("test", "t;", "a.b", "a.b"); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("New = %v, want ErrInvalid", err)
	}
	tb, err := New("test", "t", "id", "version")
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.Check("x", 1, []fence.Column{{Name: "v", Value: 1}}); err != nil {
		t.Fatalf("Check of a good write = %v", err)
	}
	err = tb.Check(nil, -1, []fence.Column{{Name: "id"}, {Name: "v"}, {Name: "v"}, {Name: `x"`}})
	if !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("Check = %v, want ErrInvalid", err)
	}
	for _, want := range []string{"nil id", "negative", "key or the version", "set twice", "sqlident"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Check error %q does not mention %q", err, want)
		}
	}
}
