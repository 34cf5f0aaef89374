package sqliteoutbox_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/internal/testkit/testenv"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/sqliteoutbox"
)

// An outbox over a fence store with its own table name checks tokens against that table: an
// append under the claimed token commits, one under an older token is refused, and nothing
// reads the default table (which does not exist here).
func TestCustomFenceTableFencesAppends(t *testing.T) {
	for _, table := range []string{"my_fences", "main.qualified_fences", "Mixed"} {
		t.Run(table, func(t *testing.T) {
			ctx := testenv.Context(t, time.Minute)
			fences, err := sqlitefence.Open(filepath.Join(t.TempDir(), "db.sqlite"), sqlitefence.Table(table))
			if err != nil {
				t.Fatal(err)
			}
			defer fences.Close()
			if err := fences.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			box, err := sqliteoutbox.New(fences, sqliteoutbox.Table("ob"))
			if err == nil {
				err = box.Migrate(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			old, cur := fence.Token{Epoch: 1}, fence.Token{Epoch: 2}
			if _, err := fences.Claim(ctx, src, old, "a"); err != nil {
				t.Fatal(err)
			}
			msg := outbox.Message{Topic: "dest", Key: []byte("k"), Value: []byte("v")}
			if err := fences.Apply(ctx, src, old, 0, 0, func(ctx context.Context, tx *sql.Tx) error {
				return box.Append(ctx, tx, src, old, msg)
			}); err != nil {
				t.Fatalf("append under the claimed token: %v", err)
			}
			if _, err := fences.Claim(ctx, src, cur, "b"); err != nil {
				t.Fatal(err)
			}
			// A zombie's append in a transaction of its own, not through the fence store's Apply.
			tx, err := fences.DB().BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			err = box.Append(ctx, tx, src, old, msg)
			var se *fence.StaleError
			if !errors.As(err, &se) {
				t.Fatalf("append under the older token after a claim: %v, want a *fence.StaleError", err)
			}
		})
	}
}
