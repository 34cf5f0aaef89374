package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/batonhq/baton/consumer/chaos"
)

// TestPSPCallInsideATransactionOwnConnections is the payment service's situation on
// PostgreSQL: a handler's transaction holds a connection of the run's pool and calls the PSP.
// The run's pool here has one connection, held by the transaction; the call must still
// complete, over connections of the PSP's own. Through the run's pool it would wait for the
// transaction that waits for it (four payment partitions on a worker's pool of four: every
// connection, and the worker's other partitions stall behind them).
func TestPSPCallInsideATransactionOwnConnections(t *testing.T) {
	base := os.Getenv("BATON_POSTGRES_URL")
	if base == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("BATON_POSTGRES_URL must be set in CI ('make up', then 'make env')")
		}
		t.Skip("BATON_POSTGRES_URL not set ('make up' starts the services)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgxpool.New(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close) // after the schema's drop: cleanups run last registered first
	schema := fmt.Sprintf("saga_psp_%d", time.Now().UnixNano())
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("dropping the test's schema: %v", err)
		}
	})

	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	url := base + sep + "search_path=" + schema
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	run, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer run.Close()
	env := chaos.Env{DB: pgDB{run}, PostgresURL: url}
	if err := execAll(ctx, env.DB, pspSchema(false)); err != nil {
		t.Fatal(err)
	}
	p, closePSP, err := openPSP(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	defer closePSP()

	tx, err := run.Begin(ctx) // the handler's transaction: the run's only connection
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	done := make(chan error, 1)
	go func() { done <- p.call(ctx, "o1", "charge", 100, "key-1", "w1") }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the PSP call: %v", err)
		}
	case <-time.After(3 * time.Second):
		_ = tx.Rollback(context.Background()) // frees the connection the call waits for
		t.Fatalf("the PSP call did not complete in 3s while the handler's transaction held the run's only connection: it waits for the run's pool (%v)", <-done)
	}
	var n int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM "+schema+".psp_ledger WHERE idem_key = 'key-1'").Scan(&n); err != nil || n != 1 {
		t.Fatalf("the PSP's ledger holds %d rows of the call (%v), want 1", n, err)
	}
}
