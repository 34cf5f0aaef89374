package status

import (
	"context"
	"fmt"
	"math"
	"strings"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/shard"
)

// ShardAddr is one database of a sharded sink (fence/shard): the shard's name, as the
// placement and the application's shard.New name it, and its store address.
type ShardAddr struct {
	Name  string
	Store string // a PostgreSQL URL or an SQLite file path (see ParseStore)
}

// placementTable is the table shard.Postgres and shard.SQLite keep the placement's history in,
// in the home shard's database.
const placementTable = "baton_placements"

// retiredPrefix starts the claimant of a fence fence/shard retired before moving its key to
// another shard ("baton.shard/retired@v<version>"); its token's epoch is math.MaxInt64.
const retiredPrefix = "baton.shard/retired@v"

// Retired reports whether a fence row is one fence/shard retired when its key moved to
// another shard: it refuses every claim and write for ever, and is no owner.
func (f Fence) Retired() bool {
	return strings.HasPrefix(f.Claimant, retiredPrefix) && f.Token.Epoch == math.MaxInt64
}

// ShardFence is a fence row of a partition on a shard the placement does not put it on.
type ShardFence struct {
	Shard    string `json:"shard"`
	Token    string `json:"token"`
	Position int64  `json:"position"`
	Claimant string `json:"claimant"`
	// Retired: fence/shard retired it when the key moved (expected after a move). A row that
	// is not retired on a shard the placement does not name is a leftover to look at: no
	// member routes to it, but nothing on that shard refuses it either.
	Retired bool `json:"retired"`
}

// shards returns the databases the collector reads: cfg.Shards, or the one database of
// cfg.Store as a placement of one shard named "".
func (cfg Config) shards() []ShardAddr {
	if len(cfg.Shards) > 0 {
		return cfg.Shards
	}
	return []ShardAddr{{Store: cfg.Store}}
}

// Sharded reports whether the collector reads several databases.
func (c *Collector) Sharded() bool { return len(c.cfg.Shards) > 0 }

// ShardStore is one shard's store, as [Collector.Shards] opened it.
type ShardStore struct {
	Name  string
	Store *Store // nil when it could not be opened (Err says why)
	Addr  string // the redacted address tried
	Err   error
}

// sourceName names a shard's source in a snapshot: "store" for the one database, "shard
// NAME" for a shard of several.
func (s ShardStore) sourceName() string {
	if s.Name == "" {
		return "store"
	}
	return "shard " + s.Name
}

// Shards opens every shard's store that is not open (read-only sessions) and returns them,
// home first. A shard that cannot be opened has a nil Store and its error; the others are
// still returned.
func (c *Collector) Shards(ctx context.Context) []ShardStore {
	out := make([]ShardStore, len(c.cfg.shards()))
	for i, a := range c.cfg.shards() {
		out[i] = ShardStore{Name: a.Name, Addr: redact(a.Store)}
		st, err := c.openStore(ctx, i)
		if err != nil {
			out[i].Err = shardErr(a.Name, err)
			continue
		}
		out[i].Store, out[i].Addr = st, st.Describe()
	}
	return out
}

// shardErr names the shard an error is about, when there are several.
func shardErr(name string, err error) error {
	if name == "" || err == nil {
		return err
	}
	return fmt.Errorf("shard %s: %w", name, err)
}

// DropShard closes shard i's store after a failed read, so that the next [Collector.Shards]
// opens it afresh (the connection may have been dropped).
func (c *Collector) DropShard(i int) {
	if c.stores[i] != nil {
		c.stores[i].Close()
		c.stores[i] = nil
	}
}

// Placement reads the placement in force from the home shard (the first). The one database
// of a collector without shards is a placement of one shard, named "", that every key
// follows. A sharded sink whose home shard has no placement, or one naming a shard the
// collector was not given, fails with [ErrNotFound].
func (c *Collector) Placement(ctx context.Context, home *Store) (shard.Placement, error) {
	if !c.Sharded() {
		return shard.Placement{Shards: []string{""}}, nil
	}
	name := c.cfg.Shards[0].Name
	if home == nil {
		return shard.Placement{}, errorf(ErrUnreachable, "the placement is unknown: its home shard %s could not be read", name)
	}
	p, err := home.Placement(ctx)
	if err != nil {
		return shard.Placement{}, err
	}
	if p.Version == 0 {
		return shard.Placement{}, errorf(ErrNotFound, "the home shard %s (%s) has no placement published in %s: is it the first of the shards the application gives shard.New?", name, home.Describe(), placementTable)
	}
	known := map[string]bool{}
	for _, s := range c.cfg.Shards {
		known[s.Name] = true
	}
	names := append([]string(nil), p.Shards...)
	for _, s := range p.Entries {
		names = append(names, s)
	}
	for _, n := range names {
		if !known[n] {
			return p, errorf(ErrNotFound, "placement %d names shard %q, which is not among the shards given (%s)", p.Version, n, c.shardNames())
		}
	}
	return p, nil
}

func (c *Collector) shardNames() string {
	var names []string
	for _, s := range c.cfg.Shards {
		names = append(names, s.Name)
	}
	return strings.Join(names, ", ")
}

// Placement reads the placement in force from this database's placement history (the home
// shard's), read-only; Version 0 when the database has none.
func (s *Store) Placement(ctx context.Context) (shard.Placement, error) {
	ok, err := s.tableExists(ctx, placementTable)
	if err != nil {
		return shard.Placement{}, errorf(ErrUnreachable, "reading the placement in %s: %v", s.Describe(), err)
	}
	if !ok {
		return shard.Placement{}, nil
	}
	s.queries.Add(1)
	p, err := s.placements().Load(ctx)
	if err != nil {
		return shard.Placement{}, fmt.Errorf("reading the placement in %s: %w", s.Describe(), err)
	}
	return p, nil
}

func (s *Store) placements() shard.Placements {
	if s.pg != nil {
		return shard.Postgres(s.pg)
	}
	return shard.SQLite(s.sql)
}

// placer decides which shard a key's line comes from: the placement's shard when the
// placement could be read; without it (its home shard unreachable), the shard holding the
// key's fence that is not retired.
type placer struct {
	p  *shard.Placement
	at map[fence.Key]string // without a placement: where a live (not retired) fence was found
}

func (pl placer) shard(k fence.Key) (string, bool) {
	if pl.p != nil {
		return pl.p.Shard(k), true
	}
	s, ok := pl.at[k]
	return s, ok
}

// errUnsharded refuses an operation that works on one database when the collector reads the
// shards of a sharded sink.
func errUnsharded() error {
	return errorf(ErrUsage, "this works on one database, not across the shards of a sharded sink: give the store of the shard the placement puts the partition on (topic identities: the home shard)")
}
