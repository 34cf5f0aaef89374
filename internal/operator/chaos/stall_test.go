package chaos

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/sqliteoutbox"
)

// The stall report's outbox section reads the stores' own tables: on SQLite (the embedded
// runs) it lists a source with rows not relayed, its delivered and last sequence and its fence,
// and nothing once they are relayed.
func TestUnrelayedListsSourcesWithPendingRows(t *testing.T) {
	ctx := context.Background()
	store, err := sqlitefence.Open(filepath.Join(t.TempDir(), "stall.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	box, err := sqliteoutbox.New(store)
	if err != nil {
		t.Fatal(err)
	}
	if err := box.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	db := SQLDB(store.DB())
	k, tok := fence.Key{Group: "g", Topic: "t", Partition: 2}, fence.Token{Epoch: 3}
	if _, err := store.Claim(ctx, k, tok, "w1"); err != nil {
		t.Fatal(err)
	}
	if err := store.Apply(ctx, k, tok, 0, 0, func(ctx context.Context, tx *sql.Tx) error {
		return box.Append(ctx, tx, k, tok, outbox.Message{Topic: "d", Value: []byte("1")},
			outbox.Message{Topic: "d", Value: []byte("2")}, outbox.Message{Topic: "d", Value: []byte("3")})
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := box.MarkDelivered(ctx, k, tok, 1); err != nil {
		t.Fatal(err)
	}
	lines, err := unrelayed(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if want := "  g t 2: 1 / 3; fence 0.3"; len(lines) != 1 || lines[0] != want {
		t.Fatalf("unrelayed = %q, want [%q]", lines, want)
	}
	if _, err := box.MarkDelivered(ctx, k, tok, 3); err != nil {
		t.Fatal(err)
	}
	if lines, err := unrelayed(ctx, db); err != nil || len(lines) != 0 {
		t.Fatalf("after relaying everything: %q, %v; want none", lines, err)
	}
}
