package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
)

// A consumer is paused past its session timeout while it owns a partition; the group hands the
// partition to another member, which claims it with the higher generation and writes. When the
// paused consumer wakes up and writes with the generation it was assigned at, the fence refuses
// it, and its write is rolled back.
func Example_zombieRefused() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "fence-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	sink, err := sqlitefence.Open(filepath.Join(dir, "billing.db"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sink.Close()
	if _, err := sink.DB().ExecContext(ctx, `CREATE TABLE account (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)`); err != nil {
		fmt.Println(err)
		return
	}
	k := fence.Key{Group: "billing", Topic: "payments", Partition: 0}
	setBalance := func(v int) func(context.Context, *sql.Tx) error {
		return func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO account (id, balance) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET balance = excluded.balance`, v)
			return err
		}
	}

	old := fence.Token{Epoch: 33} // assigned at generation 33
	st, _ := sink.Claim(ctx, k, old, "fencetest")
	fmt.Println("client 1 claims", old, "resume after", st.Position)
	_ = sink.Apply(ctx, k, old, 0, 0, setBalance(100))

	// Client 1 pauses; its session expires; the group rebalances at generation 34.
	next := fence.Token{Epoch: 34}
	st, _ = sink.Claim(ctx, k, next, "fencetest")
	fmt.Println("client 2 claims", next, "resume after", st.Position)
	_ = sink.Apply(ctx, k, next, 1, 1, setBalance(70))

	// Client 1 wakes up and writes what it computed before the pause.
	err = sink.Apply(ctx, k, old, 1, 1, setBalance(150))
	fmt.Println("client 1 writes:", err)
	var stale *fence.StaleError
	fmt.Println("stale:", errors.As(err, &stale) && stale.Presented == old && stale.Stored == next)

	var balance int
	_ = sink.DB().QueryRowContext(ctx, `SELECT balance FROM account WHERE id = 1`).Scan(&balance)
	fmt.Println("balance:", balance)
	// Output:
	// client 1 claims 0.33 resume after -1
	// client 2 claims 0.34 resume after 0
	// client 1 writes: fence: stale token for billing/payments/0: presented 0.33, stored 0.34
	// stale: true
	// balance: 70
}
