// Package shard spreads a consumer group's partitions over several databases, each partition's
// fence next to its data: a [Router] is a fence sink over named shards (one store each, e.g.
// a *pgfence.Store per PostgreSQL database) that sends every call for a fence key to the shard
// the key is placed on. Nothing in Baton's protocol needs one database: partition p's fence
// row, its state rows and its outbox rows only have to live together, in p's database.
//
//	r, err := shard.New(ctx, "a", map[string]shard.Shard[pgx.Tx]{"a": a, "b": b, "c": c}, shard.Postgres(poolA))
//	c, err := consumer.New("devices", []string{"telemetry"}, r, handler) // handler gets its shard's pgx.Tx
//
// # The placement
//
// A [Placement] is explicit, versioned and stored: its history is a table (baton_placements)
// in the home shard's database, one row per version, written by [Placements.Publish] and read
// by the router at [New] and again at every claim (Load, Claim, Recover), so a member picks up
// a new version before it claims a partition. A key listed in Entries lives on the shard named
// there; every other key follows a default rule stored with the placement: its Shards, in
// order, round-robin by partition from a start hashed from (group, topic). The rule is chosen
// over a table of every key filled at creation because keys appear after it: new groups, new
// topics, partitions added to a topic; a rule places them with no operator step, evenly. It
// is fixed for the placement's history (Publish refuses to change Shards): a new rule would
// move an unknown set of keys at once, and every move must retire the key's old fence first.
// Keys move one at a time, as entries, and an entry once listed stays listed. Shard names
// map to stores in code, in the map given to New: connection strings are never stored.
// [Placements] History lists every version with the reason it was published for ('baton
// placement show' prints it).
//
// # Why a placement change cannot let a write land on the wrong shard
//
// The interleaving to fear: a member applies a batch of key k under placement v1 on shard A
// while the operator moves k to shard B under v2. A's database alone decides what commits on
// A, so the protocol makes A refuse k before B accepts it:
//
//  1. [Router.Retire] raises k's fence on A, through A's own Recover (or Claim, for a fence
//     never claimed), to the token (era+1, MaxInt64) held by a reserved claimant
//     ("baton.shard/retired@v2"). It takes the fence row like any write, so it waits for the
//     batch in flight on A; every later Apply on A under the member's token fails with
//     fence.ErrStale (and [ErrMoved]), inside A's transaction, whatever placement the member
//     holds.
//  2. No claim on A can take the fence back: every token of era+1 is below (era+1, MaxInt64);
//     a later era only comes from Recover, which the router refuses on a retired fence
//     ([ErrMoved]: the consumer recovers after a stale claim, once the coordinator says it
//     owns the partition); and the reserved claimant is refused as a claimant. A recovery
//     racing the retirement presents the token it read before, so its compare-and-set fails.
//     A topic reset, which moves every fence of a topic to a new era without a claimant,
//     keeps a retired fence retired, in the store's own reset transaction: a fence whose
//     epoch is MaxInt64 (sealed) moves to (era+1, MaxInt64) with its claimant
//     (fence.Topics.ResetTopic states the rule for every store), so there is no moment at
//     which it is claimable, whichever call resets it and whatever races it.
//  3. [Router.Publish] stores v2 only if every key it moves is retired on its old shard for
//     v2, its fence on the new shard is above the retired one (below, the old placement's
//     tokens would not all be stale there) and stands at the old one's position (what the old
//     shard applied is there: the partition resumes after it, not from an earlier offset),
//     and the version is one above the newest stored (two operators cannot both publish).
//
// So a router holding an old placement (its home shard unreachable, or a batch under way)
// can route k to A, but nothing of k commits there: safety never depends on the freshness of
// the placement, only liveness does. Routing itself is a map lookup and a hash per call, with
// no database round trip on the Apply path.
//
// # Moving a key: Router.Move
//
// [Router.Move] is the whole procedure, each step idempotent, so that a move interrupted
// anywhere (k retired on A, placement v1 still in force: k's partition waits, nothing is lost)
// is finished by running it again:
//
//  1. Retire k on A for v2, as above. A's token R = (era+1, MaxInt64) is now above every token
//     A ever accepted (a fence only rises, and the retirement raised it last).
//  2. Seed k's fence on B above R: B's fence, through B's own Recover (recorded, with the
//     move's reason), climbs to a sealed token (e, MaxInt64) with e > R.Era, held by a
//     reserved claimant ("baton.shard/moved@v2") that the router refuses from callers.
//  3. Copy, in one transaction of B that advances B's fence under that token to A's position:
//     the caller's copy function reads what A holds of the partition (its outbox rows not yet
//     delivered with their cursor, the application's rows of the partition's keys: nothing of
//     k changes on A any more) and makes B's rows of the partition equal to them in B's
//     transaction: it deletes B's rows of the partition first (a key moving back finds there
//     the rows of its earlier stay, which it changed or deleted since), then writes A's. A
//     partition that receives through an inbox has admissions there too: the fence store's
//     keyed-fence rows whose scope names it, which the fence API cannot list, so the copy
//     function carries them from the store's keyed table. The rows and the position commit
//     together, so B's position says whether the copy is done.
//  4. Publish v2, which checks steps 1 to 3 itself, then opens B's fence: a recorded Recover
//     to (e+1, 0), same claimant. If Publish stops before that, the first claim through a
//     router routing by v2 or later opens it (and answers [ErrMoved]: claim afresh).
//
// Why the seed's token is right. A member of the old placement holds a token (era', g) that A
// accepted, so (era', g) <= R < (e, MaxInt64) < (e+1, 0): on B its write and its claim are
// stale, exactly as on A, whichever placement it routes by, frozen in a batch or not. Until
// v2 is published no claim reaches the sealed token, and a topic reset keeps it sealed with
// its claimant (fence.Topics.ResetTopic), so no member claims B's fence before the placement
// that puts k there is stored. Once it is opened, the next owner (the same member, if no
// rebalance came between, or a new one) loads B's fence and claims (e+1, generation): a
// generation is at least 1, so the claim is above (e+1, 0) and accepted without a recovery;
// it resumes after A's position, on A's rows. A token equal to the old
// owner's (a plain copy of A's fence row) would be the one mistake: a write needs no claimant,
// so the old owner's frozen batch would commit on B. And a token below R would let the old
// placement's highest tokens be above B's: their claims would be accepted on B instead of
// refused (still only until the claimant asked the coordinator, but no longer by the fence).
//
// A move back (k from A to B, then back to A) seeds A's retired fence before the placement
// putting k on A is stored, and a member routing by a placement that puts k on A (one older
// than the move: its home shard unreachable) reaches A. The sealed seed refuses its claim in
// the store; a recovery (which the consumer calls after a stale claim) the router refuses
// ([ErrMoved]) on a fence held by the seed's claimant "baton.shard/moved@vN" while the
// placement it routes by (re-read at the call) is older than N, and Claim does the same. A
// recovery racing the seed presents the token it read, so its compare-and-set fails. Once
// vN is published and a member routing by N or later claims the opened fence, its claimant
// is no longer the seed's, and a member routing by an older placement that puts k on A is
// right about where k lives again.
//
// The consumer needs no restart: a write or claim refused by a retired fence is [ErrMoved]
// (besides stale), and the consumer then waits and claims the partition afresh, through the
// router, which reads the placement at every claim and so reaches B once v2 is published.
//
// The copy function is not called when A never applied anything (a new partition: nothing to
// copy) or when B's fence already stands at A's position (the copy committed before an
// interruption). Where no position could tell a copy to make from one made, Move refuses
// the key with fence.ErrConflict before it retires anything, and the partition keeps applying
// on A: a fence on A with no position since a topic reset or a recovery (A may hold rows of
// k no position points at), and a key going back to a shard whose fence stands at A's
// position (it applied nothing since it left; the relay's delivered marks would be lost).
// Both move after the partition's next batch. Rows are
// copied, never deleted from A: they are no longer read through the router, and a key that
// comes back has them replaced by the copy (delete first, then write).
//
// # Transactions, keyed fences, topics, outboxes
//
// Apply runs fn in the shard's transaction and marks fn's ctx with the shard: [Router]'s
// Admit (the inbox's keyed fences) needs that ctx and admits in that shard, and Advance in a
// transaction of another shard's key fails with [ErrMoved]. A keyed fence is per shard: all
// admissions of a scope must run in transactions of one shard, as the inbox's do (its scope
// names the receiving partition). Topic identities live in the home shard (SeeTopic,
// TopicHistory); ResetTopic resets the other shards first and the home shard last, so
// consumers see a new identity only once every shard is reset.
//
// The outbox needs no router: outbox rows are appended in the handler's transaction, so they
// commit in the partition's shard (pgoutbox's Append checks the fence in that transaction),
// and each shard gets its own outbox store and relay; the consumer's after-commit hook picks
// the relay of the shard that r.Placement().Shard(k) names.
//
// # One transaction type
//
// A router is typed by its shards' transaction type, so its shards are all PostgreSQL
// (pgx.Tx) or all SQLite (*sql.Tx): a mix of databases of one engine (different servers,
// versions, schemas, table names). A PostgreSQL shard and an SQLite shard cannot share a
// router, since one handler cannot take both transaction types; two consumer groups, one per
// engine, can.
//
// Not supported: a transaction over two shards (a handler writing rows of keys placed on
// different shards, or a saga step spanning databases). Each batch commits in one database.
package shard
