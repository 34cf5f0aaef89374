package sqliteoutbox_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/outbox/outboxtest"
	"github.com/batonhq/baton/outbox/sqliteoutbox"
)

// TestConformance runs the outbox suite over a sqlitefence.Open file per case.
func TestConformance(t *testing.T) {
	outboxtest.Run(t, func(t *testing.T) outboxtest.Env[*sql.Tx] {
		fences, err := sqlitefence.Open(filepath.Join(t.TempDir(), "outbox.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { fences.Close() })
		store, err := sqliteoutbox.New(fences, sqliteoutbox.MaxMessageBytes(1000))
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
		return outboxtest.Env[*sql.Tx]{
			Store:           store,
			Fences:          fences,
			MaxMessageBytes: 1000,
			Begin: func(ctx context.Context) (*sql.Tx, func() error, func() error, error) {
				tx, err := fences.DB().BeginTx(ctx, nil)
				if err != nil {
					return nil, nil, nil, err
				}
				return tx, tx.Commit, tx.Rollback, nil
			},
		}
	})
}
