package sqlitebulk_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/fence/sqlitefence/sqlitebulk"
)

// A handler's batch of counter increments, the same key several times, written by one
// statement inside the store's fenced Apply.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "sqlitebulk-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	store, err := sqlitefence.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		panic(err)
	}
	defer store.Close()
	if _, err := store.DB().ExecContext(ctx, `CREATE TABLE counters (key TEXT PRIMARY KEY, n INTEGER NOT NULL)`); err != nil {
		panic(err)
	}
	up, err := sqlitebulk.NewUpsert("counters", []string{"key"},
		[]sqlitebulk.Column{{Name: "key"}, {Name: "n"}},
		"n = t.n + excluded.n",
		sqlitebulk.Merge(func(into, row []any) { into[1] = into[1].(int64) + row[1].(int64) }))
	if err != nil {
		panic(err)
	}
	if err := up.Prepare(ctx, store.DB()); err != nil { // once, at setup
		panic(err)
	}
	defer up.Close()

	k, t := fence.Key{Group: "g", Topic: "clicks", Partition: 0}, fence.Token{Epoch: 1}
	if _, err := store.Claim(ctx, k, t, "example"); err != nil {
		panic(err)
	}
	batch := []string{"a", "b", "a", "a"} // the records' keys, offsets 0..3
	err = store.Apply(ctx, k, t, 0, 3, func(ctx context.Context, tx *sql.Tx) error {
		rows := make([][]any, len(batch))
		for i, key := range batch {
			rows[i] = []any{key, int64(1)}
		}
		return up.Exec(ctx, tx, rows) // one statement, after the fence's check and advance, in its transaction
	})
	if err != nil {
		panic(err)
	}
	rows, err := store.DB().QueryContext(ctx, `SELECT key, n FROM counters ORDER BY key`)
	if err != nil {
		panic(err)
	}
	defer rows.Close()
	for rows.Next() {
		var key string
		var n int64
		if err := rows.Scan(&key, &n); err != nil {
			panic(err)
		}
		fmt.Println(key, n)
	}
	// Output:
	// a 3
	// b 1
}
