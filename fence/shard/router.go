package shard

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/fencecheck"
)

// Shard is what a router needs of each shard's store: a fenced sink with keyed fences and
// topic identities, typed by its transaction. *pgfence.Store (pgx.Tx) and
// *sqlitefence.Store (*sql.Tx) are shards.
type Shard[Tx any] interface {
	fence.Sink[Tx]
	fence.KeyedSink[Tx]
	fence.Topics
}

// Router is a fence sink over several shards: each call for a key goes to the shard the
// placement puts it on, so consumer.New(group, topics, router, handler) works unchanged and
// the handler gets that shard's transaction. It is itself a [Shard].
type Router[Tx any] interface {
	Shard[Tx]
	// Placement returns the placement the router routes by now.
	Placement() Placement
	// Retire makes k's fence on the shard it lives on now refuse every claim and write for
	// ever, recording reason, before a placement of the given version moves k elsewhere:
	// the first step of a move. It waits for a batch of k in flight there to end (the fence
	// row is locked) and is idempotent. version must be one above the placement in force.
	Retire(ctx context.Context, k fence.Key, version int64, reason string) error
	// Publish stores next as the placement in force and routes by it. next.Version must be
	// one above the newest stored (else fence.ErrConflict), its rule (Shards) the same, every
	// shard it names known to the router, and every key it moves retired on its old shard
	// for next.Version (else [ErrMoved]); nothing is stored otherwise. Once stored, it opens
	// the fences Move sealed for next.Version on the keys' new shards.
	Publish(ctx context.Context, next Placement, reason string) error
	// Move moves k to the shard named to, as one recorded procedure: it retires k's fence on
	// the shard k lives on, seeds k's fence on to above every token the old shard accepted,
	// copies the partition to to in one transaction of to (the fence's position, and through
	// copy whatever the caller stores for the partition: its outbox rows, its application
	// rows), then publishes a placement listing k on to. Each step is idempotent: a move
	// interrupted at any point (k retired and not published) is finished by calling Move
	// again with the same to. copy is called with the name of the shard k leaves (whose rows
	// of k no longer change: its fence refuses every write) and a transaction of to, and must
	// make to's rows of the partition equal to the source's: delete to's rows of the
	// partition first (a key moving back finds there the rows of its earlier stay, which the
	// partition changed or deleted since), then write the source's. The partition's rows
	// include, for a partition that receives through an inbox, its admissions: the fence
	// store's keyed-fence rows whose scope names the partition, which the router cannot list
	// through the fence API, so copy carries them (in the store's keyed table). It is
	// not called when to's fence already stands at the old shard's position (the copy
	// committed before an interruption). A move whose copy no position could tell (k's fence
	// with no position since a topic reset or a recovery, or k going back to a shard at its
	// position) fails with fence.ErrConflict before anything is done: move it after its next
	// batch. A nil copy
	// copies the fence alone. A placement published meanwhile by another key's move makes
	// Move redo its steps for the next version (fence.ErrConflict after repeated ones). Moving
	// k to the shard it lives on does nothing, unless a move of k away from it is under way
	// (k retired there for the next placement): that fails with fence.ErrConflict naming it,
	// and only Move to the move's destination finishes it.
	Move(ctx context.Context, k fence.Key, to string, copy func(ctx context.Context, k fence.Key, from string, tx Tx) error) error
}

// reservedPrefix starts the claimants the router itself uses: a retired fence's
// (retiredPrefix) and a moved key's seeded fence on its new shard (seededPrefix). The router
// refuses them as claimants, so no consumer can hold either token.
const (
	reservedPrefix = "baton.shard/"
	retiredPrefix  = reservedPrefix + "retired@v"
	seededPrefix   = reservedPrefix + "moved@v"
)

func retiredBy(version int64) string { return retiredPrefix + strconv.FormatInt(version, 10) }

func retired(claimant string) bool { return strings.HasPrefix(claimant, retiredPrefix) }

// retiredEpoch is the epoch of a retired fence's token: above every consumer-group
// generation, so no claim in its era outranks it, and eras rise only through Recover, which
// the router refuses on a retired fence. It is the sealed epoch: a topic reset keeps it and
// the retired claimant.
const retiredEpoch = fencecheck.SealedEpoch

// shardCtx marks the ctx a router passes to Apply's fn with the shard whose transaction fn
// holds, for the calls fn makes with that transaction (Admit, Advance). The value is the
// shard's *member, made once in New, so marking a ctx allocates nothing but the ctx.
type shardCtx struct{}

// member is one shard of a router: its name and its store.
type member[Tx any] struct {
	name  string
	store Shard[Tx]
}

type router[Tx any] struct {
	home   string
	shards map[string]Shard[Tx]
	byName map[string]*member[Tx]
	store  Placements
	cur    atomic.Pointer[Placement]
}

var _ Router[any] = (*router[any])(nil)

// New returns a router over shards (name → store) whose placement is stored in placements,
// in the database of the shard named home, which also keeps the topic identities. It loads
// the placement in force; none published, a shard the placement names that shards lacks, a
// nil store or an unknown home fail with fence.ErrInvalid. Connection strings are never
// stored: the placement holds only shard names.
func New[Tx any](ctx context.Context, home string, shards map[string]Shard[Tx], placements Placements) (Router[Tx], error) {
	if placements == nil {
		return nil, fmt.Errorf("%w: shard: nil placements", fence.ErrInvalid)
	}
	for name, s := range shards {
		if s == nil {
			return nil, fmt.Errorf("%w: shard: shard %q has a nil store", fence.ErrInvalid, name)
		}
	}
	if _, ok := shards[home]; !ok {
		return nil, fmt.Errorf("%w: shard: home shard %q is not among the shards", fence.ErrInvalid, home)
	}
	r := &router[Tx]{home: home, shards: shards, store: placements, byName: map[string]*member[Tx]{}}
	for name, s := range shards {
		r.byName[name] = &member[Tx]{name, s}
	}
	p, err := placements.Load(ctx)
	if err != nil {
		return nil, err
	}
	if p.Version == 0 {
		return nil, fmt.Errorf("%w: shard: no placement published in the home shard %q", fence.ErrInvalid, home)
	}
	if err := r.known(p); err != nil {
		return nil, err
	}
	r.cur.Store(&p)
	return r, nil
}

func (r *router[Tx]) known(p Placement) error {
	for _, n := range p.names() {
		if _, ok := r.shards[n]; !ok {
			return fmt.Errorf("%w: shard: placement %d names shard %q, which this router was not given", fence.ErrInvalid, p.Version, n)
		}
	}
	return nil
}

func (r *router[Tx]) Placement() Placement { return *r.cur.Load() }

// reload re-reads the placement and routes by it if it is newer. A failed read keeps the
// placement held: routing by an older placement is safe (a key's old fence is retired before
// a placement moves it), it only fails with ErrMoved until a read succeeds. A newer placement
// naming a shard this router was not given is a configuration error: it is returned, and the
// placement held is kept.
func (r *router[Tx]) reload(ctx context.Context) (Placement, error) {
	p, err := r.store.Load(ctx)
	for {
		cur := r.cur.Load()
		if err != nil || p.Version <= cur.Version {
			return *cur, nil
		}
		if err := r.known(p); err != nil {
			return *cur, err
		}
		if r.cur.CompareAndSwap(cur, &p) {
			return p, nil
		}
	}
}

// fresh is the placement re-read for a claim step.
func (r *router[Tx]) fresh(ctx context.Context, k fence.Key) (string, Shard[Tx], error) {
	_, name, s, err := r.freshPlacement(ctx, k)
	return name, s, err
}

func (r *router[Tx]) freshPlacement(ctx context.Context, k fence.Key) (Placement, string, Shard[Tx], error) {
	p, err := r.reload(ctx)
	if err != nil {
		return Placement{}, "", nil, err
	}
	name, s, err := r.route(p, k)
	return p, name, s, err
}

// seededFor returns the placement version whose move seeded a fence held by claimant, and
// whether claimant is a seed's.
func seededFor(claimant string) (int64, bool) {
	v, ok := strings.CutPrefix(claimant, seededPrefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return math.MaxInt64, true // not the router's: newer than any placement
	}
	return n, true
}

// unpublished refuses a claim or recovery of k's fence on shard name, st, when a move seeded
// it for a placement newer than p: the move may not be published yet, and a member routing by
// p reaches this shard only because p is older than the move (a move back to a shard k left:
// the seed lifted the fence there above the retired token before the placement is stored).
func (r *router[Tx]) unpublished(k fence.Key, name string, p Placement, st fence.State) error {
	if v, ok := seededFor(st.Claimant); ok && v > p.Version {
		return fmt.Errorf("%w: %s: its fence on shard %q is seeded for placement %d, this router routes by placement %d", ErrMoved, k, name, v, p.Version)
	}
	return nil
}

// open lifts k's fence on s, sealed by a move's seed for placement version, to the next era
// with epoch 0 (the same claimant), so that the next owner's claim in that era is above it.
// Only once that placement is published: Publish opens the fences of the keys it moves, and a
// claim opens one that an interrupted Publish left sealed. A fence that is not that seed's
// sealed one is left as it is.
func open[Tx any](ctx context.Context, s Shard[Tx], k fence.Key, st fence.State, version int64, reason string) (bool, error) {
	if st.Claimant != seededBy(version) || st.Token.Epoch != retiredEpoch {
		return false, nil
	}
	_, err := s.Recover(ctx, k, st.Token, 0, st.Claimant, reason)
	if errors.Is(err, fence.ErrConflict) {
		return true, nil // opened, or moved on, meanwhile
	}
	return err == nil, err
}

func (r *router[Tx]) route(p Placement, k fence.Key) (string, Shard[Tx], error) {
	m, err := r.member(p, k)
	if err != nil {
		return "", nil, err
	}
	return m.name, m.store, nil
}

func (r *router[Tx]) member(p Placement, k fence.Key) (*member[Tx], error) {
	name := p.Shard(k)
	m, ok := r.byName[name]
	if !ok {
		return nil, fmt.Errorf("%w: shard: %s is placed on shard %q, which this router was not given", fence.ErrInvalid, k, name)
	}
	return m, nil
}

func (r *router[Tx]) moved(k fence.Key, name string, st fence.State) error {
	return fmt.Errorf("%w: %s: its fence on shard %q is retired (%s, token %s)", ErrMoved, k, name, st.Claimant, st.Token)
}

func refuseRetired(claimant string) error {
	if strings.HasPrefix(claimant, reservedPrefix) {
		return fmt.Errorf("%w: claimant %q is reserved for retired and moved fences", fence.ErrInvalid, claimant)
	}
	return nil
}

// movedOff marks a refusal by a retired fence (a *fence.StaleError whose stored token has the
// retired epoch, which no claim reaches) as ErrMoved too, so that a consumer waits for the
// move's publication instead of treating the refusal as a regression. The stale error stays
// in the tree: errors.Is(err, fence.ErrStale) holds as before.
func movedOff(k fence.Key, name string, err error) error {
	var se *fence.StaleError
	if errors.As(err, &se) && se.Stored.Epoch == retiredEpoch {
		return fmt.Errorf("%w: %s: its fence on shard %q is retired: %w", ErrMoved, k, name, err)
	}
	return err
}

// Claim routes by the placement re-read from the home shard (the one held if that fails).
func (r *router[Tx]) Claim(ctx context.Context, k fence.Key, t fence.Token, claimant string) (fence.State, error) {
	if err := refuseRetired(claimant); err != nil {
		return fence.State{}, err
	}
	p, name, s, err := r.freshPlacement(ctx, k)
	if err != nil {
		return fence.State{}, err
	}
	// A seed raises the fence's era and a claim never does, so a claim whose token was read
	// before a seed that lands between this check and the store's Claim is stale there.
	cur, err := s.Load(ctx, k)
	if err != nil {
		return fence.State{}, err
	}
	if err := r.unpublished(k, name, p, cur); err != nil {
		return fence.State{}, err
	}
	if v, ok := seededFor(cur.Claimant); ok {
		opened, err := open(ctx, s, k, cur, v, fmt.Sprintf("claim of %s under placement %d: open on %s", k, p.Version, name))
		if err != nil {
			return fence.State{}, err
		}
		if opened {
			return fence.State{}, fmt.Errorf("%w: %s: its fence on shard %q, seeded for placement %d, was opened to the next era: claim afresh", ErrMoved, k, name, v)
		}
	}
	st, err := s.Claim(ctx, k, t, claimant)
	return st, movedOff(k, name, err)
}

// Load routes by the placement re-read from the home shard (the one held if that fails): a
// claim starts with it.
func (r *router[Tx]) Load(ctx context.Context, k fence.Key) (fence.State, error) {
	_, s, err := r.fresh(ctx, k)
	if err != nil {
		return fence.State{}, err
	}
	return s.Load(ctx, k)
}

func (r *router[Tx]) Apply(ctx context.Context, k fence.Key, t fence.Token, first, last int64, fn func(ctx context.Context, tx Tx) error) error {
	m, err := r.member(*r.cur.Load(), k)
	if err != nil {
		return err
	}
	// A store passes fn a ctx derived from the one it was given, so the mark reaches fn.
	return movedOff(k, m.name, m.store.Apply(context.WithValue(ctx, shardCtx{}, m), k, t, first, last, fn))
}

// Advance runs in the caller's transaction, which must belong to k's shard: the fence check
// runs in that transaction's database, where a key placed elsewhere has no claimed fence or a
// retired one. Inside a router's Apply it fails with ErrMoved for a key of another shard.
func (r *router[Tx]) Advance(ctx context.Context, tx Tx, k fence.Key, t fence.Token, first, last int64) error {
	name, s, err := r.route(*r.cur.Load(), k)
	if err != nil {
		return err
	}
	if in, ok := ctx.Value(shardCtx{}).(*member[Tx]); ok && in.name != name {
		return fmt.Errorf("%w: %s lives on shard %q, the transaction is shard %q's", ErrMoved, k, name, in.name)
	}
	return s.Advance(ctx, tx, k, t, first, last)
}

// Recover refuses a retired fence: the consumer recovers after its claim was refused as
// stale, and a retired fence refuses every claim so.
func (r *router[Tx]) Recover(ctx context.Context, k fence.Key, expected fence.Token, epoch int64, claimant, reason string) (fence.Token, error) {
	if err := refuseRetired(claimant); err != nil {
		return fence.Token{}, err
	}
	p, name, s, err := r.freshPlacement(ctx, k)
	if err != nil {
		return fence.Token{}, err
	}
	// A fence retired or seeded after this read has another token than expected (a retirement is a
	// Recover or a Claim that raises it), so the compare-and-set below fails.
	st, err := s.Load(ctx, k)
	if err != nil {
		return fence.Token{}, err
	}
	if retired(st.Claimant) {
		_, _ = r.reload(ctx)
		return fence.Token{}, r.moved(k, name, st)
	}
	if err := r.unpublished(k, name, p, st); err != nil {
		return fence.Token{}, err
	}
	return s.Recover(ctx, k, expected, epoch, claimant, reason)
}

func (r *router[Tx]) Recoveries(ctx context.Context, k fence.Key) ([]fence.Recovery, error) {
	_, s, err := r.route(*r.cur.Load(), k)
	if err != nil {
		return nil, err
	}
	return s.Recoveries(ctx, k)
}

// Admit runs in a transaction the router began: fn's ctx in Apply names its shard.
func (r *router[Tx]) Admit(ctx context.Context, tx Tx, scope, id string, t fence.Token, seq int64) (fence.Verdict, error) {
	in, ok := ctx.Value(shardCtx{}).(*member[Tx])
	if !ok {
		return 0, fmt.Errorf("%w: shard: Admit through a router needs the ctx of the router's Apply (it names the transaction's shard); admit through the shard's store otherwise", fence.ErrInvalid)
	}
	return in.store.Admit(ctx, tx, scope, id, t, seq)
}

// SeeTopic reads and adopts topic identities in the home shard only: one authority per
// (group, topic), whatever the number of shards its partitions are spread over.
func (r *router[Tx]) SeeTopic(ctx context.Context, group, topic string, seen fence.Topic, reason string) (fence.Topic, bool, error) {
	return r.shards[r.home].SeeTopic(ctx, group, topic, seen, reason)
}

func (r *router[Tx]) TopicHistory(ctx context.Context, group, topic string) ([]fence.TopicRecord, error) {
	return r.shards[r.home].TopicHistory(ctx, group, topic)
}

// ResetTopic checks the home shard's identity first, then resets every other shard and the
// home shard last, so consumers (which read the identity from the home shard) see the new
// identity only once every shard's fences were reset. A shard already at to is skipped and one
// that never saw the topic adopts expected first, so a reset interrupted by a shard's failure
// is completed by calling it again. A retired fence stays retired through the reset: its
// token is sealed (epoch math.MaxInt64), and each store's reset keeps a sealed fence's epoch
// and claimant in its own transaction (fence.Topics.ResetTopic).
func (r *router[Tx]) ResetTopic(ctx context.Context, group, topic string, expected, to fence.Topic, reason string) error {
	if err := fencecheck.ValidateReset(group, topic, expected, to, reason); err != nil {
		return err
	}
	home := r.shards[r.home]
	if stored, found, err := latest(ctx, home, group, topic); err != nil {
		return fmt.Errorf("shard %q: %w", r.home, err)
	} else if _, err := fencecheck.CheckTopicReset(group, topic, stored, found, expected, to); err != nil {
		return fmt.Errorf("shard %q: %w", r.home, err)
	}
	names := make([]string, 0, len(r.shards))
	for n := range r.shards {
		if n != r.home {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	for _, n := range append(names, r.home) {
		s := r.shards[n]
		stored, found, err := latest(ctx, s, group, topic)
		if err != nil {
			return fmt.Errorf("shard %q: %w", n, err)
		}
		switch {
		case found && stored == to:
			continue
		case !found:
			if _, _, err := s.SeeTopic(ctx, group, topic, expected, reason); err != nil {
				return fmt.Errorf("shard %q: %w", n, err)
			}
		}
		if err := s.ResetTopic(ctx, group, topic, expected, to, reason); err != nil {
			return fmt.Errorf("shard %q: %w", n, err)
		}
	}
	return nil
}

// latest returns the identity s stores for (group, topic), and whether it stores one.
func latest(ctx context.Context, s fence.Topics, group, topic string) (fence.Topic, bool, error) {
	h, err := s.TopicHistory(ctx, group, topic)
	if err != nil || len(h) == 0 {
		return fence.Topic{}, false, err
	}
	return h[len(h)-1].Identity, true, nil
}

func (r *router[Tx]) Retire(ctx context.Context, k fence.Key, version int64, reason string) error {
	p, err := r.reload(ctx)
	if err != nil {
		return err
	}
	if version != p.Version+1 {
		return fmt.Errorf("%w: retiring %s for placement %d, the placement in force is %d", fence.ErrConflict, k, version, p.Version)
	}
	name, s, err := r.route(p, k)
	if err != nil {
		return err
	}
	marker := retiredBy(version)
	for {
		st, err := s.Load(ctx, k)
		if err != nil {
			return err
		}
		switch {
		case st.Claimant == marker:
			return nil
		case st.Token == (fence.Token{}) && st.Claimant == "":
			// Never claimed: take it with a token no claim in its era outranks.
			_, err = s.Claim(ctx, k, fence.Token{Epoch: retiredEpoch}, marker)
		default:
			_, err = s.Recover(ctx, k, st.Token, retiredEpoch, marker, reason)
		}
		if errors.Is(err, fence.ErrConflict) || errors.Is(err, fence.ErrStale) {
			continue // the fence moved between the load and the compare-and-set: decide again
		}
		if err != nil {
			return fmt.Errorf("shard: retiring %s on shard %q: %w", k, name, err)
		}
		return nil
	}
}

func (r *router[Tx]) Publish(ctx context.Context, next Placement, reason string) error {
	if err := next.validate(); err != nil {
		return err
	}
	if err := r.known(next); err != nil {
		return err
	}
	cur, err := r.reload(ctx)
	if err != nil {
		return err
	}
	if next.Version != cur.Version+1 {
		return fmt.Errorf("%w: placement %d is not one above the placement in force, %d", fence.ErrConflict, next.Version, cur.Version)
	}
	if !slices.Equal(next.Shards, cur.Shards) {
		return fmt.Errorf("%w: placement %d changes the default rule's shards %v to %v: move keys one by one, as entries", fence.ErrInvalid, next.Version, cur.Shards, next.Shards)
	}
	for k := range cur.Entries {
		if _, ok := next.Entries[k]; !ok {
			return fmt.Errorf("%w: placement %d drops the entry of %s: an entry, once listed, stays (place the key on its rule's shard explicitly)", fence.ErrInvalid, next.Version, k)
		}
	}
	marker := retiredBy(next.Version)
	for _, k := range movedKeys(cur, next) {
		from := cur.Shard(k)
		st, err := r.shards[from].Load(ctx, k)
		if err != nil {
			return fmt.Errorf("shard: publishing placement %d: loading %s on shard %q: %w", next.Version, k, from, err)
		}
		if st.Claimant != marker {
			return fmt.Errorf("%w: placement %d moves %s from shard %q to %q, but its fence there is not retired for it (Retire first)", ErrMoved, next.Version, k, from, next.Shard(k))
		}
		// The new shard must already hold what the old one applied: a fence there behind the
		// old position would resume the partition from an earlier offset, re-applying records
		// to rows that never saw the ones before (the copy of the partition's rows and fence is
		// the move's step between Retire and Publish).
		to := next.Shard(k)
		dst, err := r.shards[to].Load(ctx, k)
		if err != nil {
			return fmt.Errorf("shard: publishing placement %d: loading %s on shard %q: %w", next.Version, k, to, err)
		}
		// And every token the old shard ever accepted must be below the new shard's: a member
		// of the old placement holding its token (frozen in a batch, or routing by a placement
		// it read before) is refused there as stale, as on the old shard, and so is its claim.
		// Retire left the old shard's token above every token it accepted before.
		if retired(dst.Claimant) || dst.Token.Compare(st.Token) <= 0 {
			return fmt.Errorf("%w: placement %d moves %s from shard %q, whose fence stands at %s, to shard %q, whose fence stands at %s (%s): seed the new shard's fence above the old one first (Move)", ErrMoved, next.Version, k, from, st.Token, to, dst.Token, dst.Claimant)
		}
		if dst.Position != st.Position {
			return fmt.Errorf("%w: placement %d moves %s from shard %q, where it has applied up to position %d, to shard %q, whose fence stands at %d: copy the partition's rows and fence to %q first", ErrMoved, next.Version, k, from, st.Position, to, dst.Position, to)
		}
	}
	if err := r.store.Publish(ctx, next, reason); err != nil {
		return err
	}
	// Open the seeded fences of the keys moved, now that the placement putting them there is
	// stored. One left sealed (an error here) is opened by the first claim through a router.
	for _, k := range movedKeys(cur, next) {
		to := next.Shard(k)
		if st, err := r.shards[to].Load(ctx, k); err == nil {
			_, _ = open(ctx, r.shards[to], k, st, next.Version, reason+": open on "+to)
		}
	}
	_, err = r.reload(ctx)
	return err
}

// movedKeys lists the keys whose shard differs between from and to. The rule is the same in
// both and to keeps from's entries, so only to's entries can move.
func movedKeys(from, to Placement) []fence.Key {
	var keys []fence.Key
	for k := range to.Entries {
		if from.Shard(k) != to.Shard(k) {
			keys = append(keys, k)
		}
	}
	return keys
}
