package shard_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/shard"
	"github.com/batonhq/baton/fence/sqlitefence"
)

// Three SQLite files as shards, the placement stored in the first (the home shard), and one
// partition moved: retired on its shard, then placed on another by the next version.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "shards")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	shards := map[string]shard.Shard[*sql.Tx]{}
	var home *sqlitefence.Store
	for _, name := range []string{"a", "b", "c"} {
		s, err := sqlitefence.Open(filepath.Join(dir, name+".db"))
		if err != nil {
			log.Fatal(err)
		}
		defer s.Close()
		shards[name] = s
		if name == "a" {
			home = s
		}
	}
	placements := shard.SQLite(home.DB())
	if err := placements.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	first := shard.Placement{Version: 1, Shards: []string{"a", "b", "c"}}
	if err := placements.Publish(ctx, first, "three shards"); err != nil {
		log.Fatal(err)
	}
	r, err := shard.New(ctx, "a", shards, placements)
	if err != nil {
		log.Fatal(err)
	}
	key := func(p int32) fence.Key { return fence.Key{Group: "devices", Topic: "telemetry", Partition: p} }
	for p := range int32(4) {
		fmt.Printf("partition %d on %s\n", p, r.Placement().Shard(key(p)))
	}

	// Move partition 0 to the shard after its own.
	k := key(0)
	from := r.Placement().Shard(k)
	to := map[string]string{"a": "b", "b": "c", "c": "a"}[from]
	// Retire on the old shard, seed and copy on the new one, publish placement 2. A nil copy
	// function copies the fence alone: this partition has no rows of the application's yet.
	if err := r.Move(ctx, k, to, nil); err != nil {
		log.Fatal(err)
	}
	fmt.Println("partition 0 moved:", r.Placement().Shard(k) == to, "version", r.Placement().Version)
	// The old shard refuses every claim of the partition for ever.
	_, err = shards[from].Claim(ctx, k, fence.Token{Epoch: 9}, "member-1")
	fmt.Println("claim on the old shard stale:", errors.Is(err, fence.ErrStale))
	// Output:
	// partition 0 on b
	// partition 1 on c
	// partition 2 on a
	// partition 3 on b
	// partition 0 moved: true version 2
	// claim on the old shard stale: true
}
