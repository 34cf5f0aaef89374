package redisfence

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/fencecheck"
)

var (
	_ fence.Sink[*Tx]      = (*Store)(nil)
	_ fence.KeyedSink[*Tx] = (*Store)(nil)
	_ fence.Topics         = (*Store)(nil)
)

// errBroken reports a refusal that the stored state it returned does not explain, which the
// script's atomicity makes impossible.
var errBroken = errors.New("redisfence: the script refused, yet the stored state admits it")

// holdTTL bounds how long a transaction that died between Advance (or Admit) and its commit
// keeps others waiting. It orders writers only; safety never depends on it.
const holdTTL = 10 * time.Second

// Store is the fenced sink in Redis. It is safe for concurrent use.
type Store struct {
	c         redis.Cmdable
	k         keys
	allowLoss bool

	mu       sync.Mutex
	checked  bool   // the server's settings were accepted
	cluster  bool   // the server runs Redis Cluster: a transaction's keys must share a slot
	wait     bool   // a standalone server, the wait not waived: each fence write waits for the replicas
	replicas int    // the most replicas seen connected (at Check or after a fence write): each fence write waits for them
	replid   string // the server's replication ID when its settings were read: another one is another server
}

// Option configures a [Store].
type Option func(*Store) error

// Prefix sets the prefix of every key the store writes (default "baton:"):
// 1 to 63 of A-Z a-z 0-9 _ . : -. The caller's keys may not start with it.
func Prefix(p string) Option {
	return func(s *Store) error {
		if err := validatePrefix(p); err != nil {
			return err
		}
		s.k.prefix = p
		return nil
	}
}

// AllowLosingAcknowledgedWrites lets the store run on a server whose settings can lose a write
// it acknowledged (appendonly no; appendfsync everysec or no), or whose settings it cannot read,
// or on a Redis Cluster with replicas, and stops it from waiting for a standalone server's
// replicas to confirm each fence write. A crash of such a server, or a failover to a replica,
// can lose fence advances together with the data: the owner's resume position moves back (its
// batches are applied again) and a zombie whose token only a lost claim had outranked is
// accepted again until the current owner claims anew. Use it for tests, caches and data you
// can rebuild; without it the store refuses such a server with [ErrNotDurable], and on a
// standalone server answers a fence write only once its replicas all confirmed it.
func AllowLosingAcknowledgedWrites() Option {
	return func(s *Store) error { s.allowLoss = true; return nil }
}

// New returns a store on c (a *redis.Client, a failover client or a *redis.ClusterClient; a
// *redis.Ring is refused with [fence.ErrInvalid]). It does no I/O: the server's settings are
// checked by [Store.Check], which the first call that reaches the server runs if the caller
// did not.
func New(c redis.Cmdable, opts ...Option) (*Store, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: nil Redis client", fence.ErrInvalid)
	}
	if _, ok := c.(*redis.Ring); ok {
		// A Ring sends a keyless command (INFO, CONFIG, WAIT) to a random shard, and a
		// pipeline's commands to their shards on connections of their own.
		return nil, fmt.Errorf("%w: a *redis.Ring: the store could not check its shards nor wait on the connection of its writes; use a Client, a failover client or a cluster client", fence.ErrInvalid)
	}
	s := &Store{c: c, k: keys{prefix: defaultPrefix}}
	for _, o := range opts {
		if err := o(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Check reads the server's persistence settings (CONFIG GET appendonly, appendfsync,
// no-appendfsync-on-rewrite, maxmemory-policy), whether it runs Redis Cluster, and on a
// standalone server how many replicas are connected to it (INFO replication), which every
// fence write then waits for (see "Durability" in the package doc). It fails with
// [ErrNotDurable] unless appendonly is yes, appendfsync always, no-appendfsync-on-rewrite no
// and the eviction policy spares keys without a TTL (noeviction or volatile-*), or
// [AllowLosingAcknowledgedWrites] was given (it also waives the wait); a server that refuses
// CONFIG (renamed away, or not permitted to this user) cannot be checked and is refused the
// same way, as are a Redis Cluster with a replica (CLUSTER NODES) and, on a standalone server,
// a user who may not PUBLISH to the store's channel (which the wait needs). Once it succeeded
// it is not repeated: a setting changed at runtime later is not seen (on a standalone server
// the replicas are counted again after each fence write, and the settings of a server reached
// after a failover are read before a write on it is acknowledged).
func (s *Store) Check(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.checked {
		return nil
	}
	info, err := s.c.Info(ctx, "cluster").Result()
	if err != nil {
		return fmt.Errorf("redisfence: INFO cluster: %w", err)
	}
	cluster := strings.Contains(info, "cluster_enabled:1")
	if err := durable(ctx, s.c); err != nil && !s.allowLoss {
		return err
	}
	if cluster && !s.allowLoss {
		if err := clusterWithoutReplicas(ctx, s.c); err != nil {
			return err
		}
	}
	wait, replicas, replid := !cluster && !s.allowLoss, 0, ""
	if wait {
		if replicas, replid, err = connectedReplicas(ctx, s.c); err != nil {
			return err
		}
		if err := s.c.Publish(ctx, s.channel(), "").Err(); err != nil {
			return fmt.Errorf("%w: PUBLISH %s, which each fence write sends so that WAIT covers it: %v; permit the channel to this user (&%s)",
				ErrNotDurable, s.channel(), err, s.channel())
		}
	}
	s.checked, s.cluster, s.wait, s.replicas, s.replid = true, cluster, wait, replicas, replid
	return nil
}

// clusterWithoutReplicas fails with ErrNotDurable if a node of the cluster is a replica: the
// store does not wait for a cluster's replicas, so a failover to one could lose acknowledged
// fence advances.
func clusterWithoutReplicas(ctx context.Context, c redis.Cmdable) error {
	nodes, err := c.ClusterNodes(ctx).Result()
	if err != nil {
		return fmt.Errorf("redisfence: CLUSTER NODES: %w", err)
	}
	var replicas []string
	for line := range strings.SplitSeq(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && slices.Contains(strings.Split(f[2], ","), "slave") {
			replicas = append(replicas, f[1])
		}
	}
	if len(replicas) > 0 {
		return fmt.Errorf("%w: a Redis Cluster with replicas (%s): the store does not wait for them, so a failover to one can lose acknowledged fence advances; run the cluster without replicas, or pass AllowLosingAcknowledgedWrites",
			ErrNotDurable, strings.Join(replicas, ", "))
	}
	return nil
}

func (s *Store) channel() string { return s.k.prefix + "replicated" }

// replicaWait bounds how long a fence write waits for the replicas to confirm it. It stays
// below go-redis's default ReadTimeout (3 s), which bounds the pipeline that waits.
const replicaWait = time.Second

// connectedReplicas is the number of replicas connected to the server (INFO replication), 0
// for a server that is itself a replica, and the server's replication ID.
func connectedReplicas(ctx context.Context, c redis.Cmdable) (int, string, error) {
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return 0, "", fmt.Errorf("redisfence: INFO replication: %w", err)
	}
	n, err := parseReplicas(info)
	return n, replicationID(info), err
}

// replicationID reads master_replid from INFO replication: a primary promoted by a failover,
// or restarted, has a new one.
func replicationID(info string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "master_replid:"); ok {
			return v
		}
	}
	return ""
}

// parseReplicas reads connected_slaves from INFO replication, 0 for a server that is itself a
// replica.
func parseReplicas(info string) (int, error) {
	if !strings.Contains(info, "role:master") {
		return 0, nil
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_slaves:"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				return 0, fmt.Errorf("redisfence: INFO replication: connected_slaves %q: %w", v, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("redisfence: INFO replication without connected_slaves")
}

// durable reads the settings that decide whether an acknowledged write survives: the
// append-only file and its fsync policy, whether fsync pauses during a rewrite, and whether
// the server may evict keys without a TTL (a fence has none) when memory runs out.
func durable(ctx context.Context, c redis.Cmdable) error {
	cfg := map[string]string{}
	for _, p := range []string{"append*", "no-appendfsync-on-rewrite", "maxmemory-policy"} {
		m, err := c.ConfigGet(ctx, p).Result()
		if err != nil {
			return fmt.Errorf("%w: the settings cannot be read (CONFIG GET: %v); verify appendonly yes, appendfsync always, no-appendfsync-on-rewrite no and a maxmemory-policy that is not allkeys-* yourself and pass AllowLosingAcknowledgedWrites", ErrNotDurable, err)
		}
		maps.Copy(cfg, m)
	}
	var bad []string
	if cfg["appendonly"] != "yes" {
		bad = append(bad, "appendonly "+orNone(cfg["appendonly"])+" (want yes)")
	}
	if cfg["appendfsync"] != "always" {
		bad = append(bad, "appendfsync "+orNone(cfg["appendfsync"])+" (want always)")
	}
	if cfg["no-appendfsync-on-rewrite"] != "no" {
		bad = append(bad, "no-appendfsync-on-rewrite "+orNone(cfg["no-appendfsync-on-rewrite"])+" (want no: fsync must not pause during a rewrite)")
	}
	if p := cfg["maxmemory-policy"]; p == "" || strings.HasPrefix(p, "allkeys-") {
		bad = append(bad, "maxmemory-policy "+orNone(p)+" (evicts fences: want noeviction or a volatile-* policy)")
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: %s; a crash or an eviction can lose acknowledged fence advances: change them, or pass AllowLosingAcknowledgedWrites",
			ErrNotDurable, strings.Join(bad, ", "))
	}
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "(unknown)"
	}
	return s
}

func (s *Store) ready(ctx context.Context) error {
	s.mu.Lock()
	ok := s.checked
	s.mu.Unlock()
	if ok {
		return nil
	}
	return s.Check(ctx)
}

func (s *Store) isCluster() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cluster
}

func i64(n int64) string { return strconv.FormatInt(n, 10) }

// run runs a script, waiting while it answers "held" (another transaction holds a fence it
// needs), and returns its reply as strings. On a standalone server, a script that writes a
// fence (every one but holdScript's) answers only once its replicas confirmed.
func (s *Store) run(ctx context.Context, sc *redis.Script, keys []string, args ...any) ([]string, error) {
	s.mu.Lock()
	replicated := s.wait && sc != holdScript
	s.mu.Unlock()
	wait := time.Millisecond
	for {
		var r []string
		var err error
		if replicated {
			r, err = s.runReplicated(ctx, sc, keys, args...)
		} else {
			r, err = sc.Run(ctx, s.c, keys, args...).StringSlice()
		}
		if err != nil {
			return nil, err
		}
		if len(r) == 0 {
			return nil, fmt.Errorf("redisfence: empty script reply")
		}
		if r[0] != "held" {
			return r, nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("redisfence: waiting for a transaction that holds the fence: %w", context.Cause(ctx))
		case <-t.C:
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// runReplicated runs a script, a PUBLISH, WAIT and INFO replication in one pipeline, on one
// connection (WAIT counts the writes of its own connection), and returns the script's reply
// only if every replica confirmed within replicaWait; otherwise it fails with ErrNotDurable
// whatever the script answered. The PUBLISH (a message to a channel nobody needs to hear,
// which the primary sends its replicas) makes WAIT cover everything the primary had written
// when the script ran, even when the script itself wrote nothing: the retry of a commit the
// primary had applied is answered fence.ErrDuplicate only once the replicas have that commit
// too. The INFO counts the replicas connected after the WAIT: one more than it waited for (a
// replica attached since, or one that was away at the check) fails the write too, and is
// waited for from then on. A replica that goes away is still waited for.
func (s *Store) runReplicated(ctx context.Context, sc *redis.Script, keys []string, args ...any) ([]string, error) {
	s.mu.Lock()
	want, replid := s.replicas, s.replid
	s.mu.Unlock()
	for _, load := range []bool{false, true} {
		p := s.c.Pipeline()
		var cmd *redis.Cmd
		if load {
			cmd = sc.Eval(ctx, p, keys, args...)
		} else {
			cmd = sc.EvalSha(ctx, p, keys, args...)
		}
		pub := p.Publish(ctx, s.channel(), "")
		acks := p.Do(ctx, "WAIT", want, replicaWait.Milliseconds())
		info := p.Info(ctx, "replication")
		_, _ = p.Exec(ctx) // each command's error is read below
		if !load && redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			continue // a server that lost its script cache (a restart, a failover): send it whole
		}
		r, err := cmd.StringSlice()
		if err != nil {
			return nil, err
		}
		if err := pub.Err(); err != nil {
			return nil, fmt.Errorf("%w: PUBLISH %s, without which WAIT may not cover the write: %v", ErrNotDurable, s.channel(), err)
		}
		n, err := acks.Int64()
		if err != nil {
			return nil, fmt.Errorf("redisfence: WAIT: %w", err)
		}
		if err := info.Err(); err != nil {
			return nil, fmt.Errorf("redisfence: INFO replication: %w", err)
		}
		if id := replicationID(info.Val()); id != replid {
			// Another server than the one checked (a failover client's new primary), or the
			// same one restarted: its settings decide whether this write is acknowledged.
			if err := durable(ctx, s.c); err != nil {
				return nil, fmt.Errorf("the server changed (replication ID %s, checked %s): %w", id, replid, err)
			}
			s.mu.Lock()
			s.replid = id
			s.mu.Unlock()
		}
		now, err := parseReplicas(info.Val())
		if err != nil {
			return nil, err
		}
		if now > want {
			s.mu.Lock()
			s.replicas = max(s.replicas, now)
			s.mu.Unlock()
			return nil, fmt.Errorf("%w: %d replicas are connected, the write waited for %d: it is not acknowledged (a failover may lose it); retry",
				ErrNotDurable, now, want)
		}
		if n < int64(want) {
			return nil, fmt.Errorf("%w: %d of %d replicas confirmed the write within %s: it is not acknowledged (a failover may lose it); retry",
				ErrNotDurable, n, want, replicaWait)
		}
		return r, nil
	}
	return nil, errors.New("redisfence: the server answered NOSCRIPT to EVAL")
}

// parseState reads era, epoch, position, claimant from script output.
func parseState(r []string) (fence.State, error) {
	if len(r) < 4 {
		return fence.State{}, fmt.Errorf("redisfence: short fence reply %q", r)
	}
	var st fence.State
	var errs [3]error
	st.Token.Era, errs[0] = strconv.ParseInt(r[0], 10, 64)
	st.Token.Epoch, errs[1] = strconv.ParseInt(r[1], 10, 64)
	st.Position, errs[2] = strconv.ParseInt(r[2], 10, 64)
	st.Claimant = r[3]
	if err := errors.Join(errs[:]...); err != nil {
		return fence.State{}, fmt.Errorf("redisfence: fence reply %q: %w", r, err)
	}
	return st, nil
}

// Claim implements [fence.Sink] in one script. It fails with a *[fence.StaleError] if the
// stored token is higher (or equal and held by another claimant), and with [fence.ErrInvalid]
// if t is of a later era than the stored token. It waits while a transaction holds the fence.
func (s *Store) Claim(ctx context.Context, k fence.Key, t fence.Token, claimant string) (fence.State, error) {
	if err := fencecheck.ValidateClaim(k, t, claimant); err != nil {
		return fence.State{}, err
	}
	if err := s.ready(ctx); err != nil {
		return fence.State{}, err
	}
	fk := s.k.fence(k)
	r, err := s.run(ctx, claimScript, []string{fk, hold(fk), s.k.partitions(k.Group, k.Topic)},
		i64(t.Era), i64(t.Epoch), claimant, i64(int64(k.Partition)))
	if err != nil {
		return fence.State{}, fmt.Errorf("redisfence: claim %s: %w", k, err)
	}
	if r[0] == "ok" && len(r) == 2 {
		pos, err := strconv.ParseInt(r[1], 10, 64)
		if err != nil {
			return fence.State{}, fmt.Errorf("redisfence: claim %s: position %q: %w", k, r[1], err)
		}
		return fence.State{Token: t, Position: pos, Claimant: claimant}, nil
	}
	cur, err := parseState(r[1:])
	if err != nil {
		return fence.State{}, err
	}
	if err := fencecheck.CheckClaim(k, cur, t, claimant); err != nil {
		return fence.State{}, err
	}
	return fence.State{}, fmt.Errorf("%w: claim %s with %s, stored %s", errBroken, k, t, cur.Token)
}

// Load implements [fence.Sink]: the stored state, the zero token and [fence.NoPosition] for
// a key never claimed.
func (s *Store) Load(ctx context.Context, k fence.Key) (fence.State, error) {
	if err := fencecheck.ValidateKey(k); err != nil {
		return fence.State{}, err
	}
	if err := s.ready(ctx); err != nil {
		return fence.State{}, err
	}
	v, err := s.c.HMGet(ctx, s.k.fence(k), "era", "epoch", "pos", "claimant").Result()
	if err != nil {
		return fence.State{}, fmt.Errorf("redisfence: load %s: %w", k, err)
	}
	r := []string{"0", "0", "-1", ""}
	for i, x := range v {
		if str, ok := x.(string); ok {
			r[i] = str
		}
	}
	return parseState(r)
}

// Apply implements [fence.Sink]: fn queues the batch's commands on a new [Tx], then one script
// checks and advances the fence over first..last under t and runs the commands, all or
// nothing. It fails with a *[fence.StaleError], [fence.ErrNotClaimed], [fence.ErrDuplicate],
// [fence.ErrOverlap], [fence.ErrInvalid] (a token of a later era than the stored one, a bad
// command), [ErrCommand], [ErrCrossSlot] or fn's error; in each case nothing was written. fn
// runs once; while another transaction holds the fence the script waits for it.
func (s *Store) Apply(ctx context.Context, k fence.Key, t fence.Token, first, last int64, fn func(ctx context.Context, tx *Tx) error) error {
	if err := fencecheck.ValidateWrite(k, t, first, last); err != nil {
		return err
	}
	if fn == nil {
		return fmt.Errorf("%w: nil function", fence.ErrInvalid)
	}
	if err := s.ready(ctx); err != nil {
		return err
	}
	tx := s.Begin()
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fn(ctx, tx); err != nil {
		return err
	}
	tx.advance(k, t, first, last)
	return tx.Commit(ctx)
}

// Advance implements [fence.Sink]: it adds the check-and-advance of the fence over first..last
// under t to tx, which the commit runs in the same script as tx's commands. It takes the fence
// for tx (claims and other transactions of it wait until tx ends, or for at most ten seconds)
// and reports a refusal now, judged on the stored state, as Apply would: the caller then
// rolls back. The commit checks again and refuses a write the state no longer admits.
func (s *Store) Advance(ctx context.Context, tx *Tx, k fence.Key, t fence.Token, first, last int64) error {
	if err := fencecheck.ValidateWrite(k, t, first, last); err != nil {
		return err
	}
	if tx == nil || tx.s != s {
		return fmt.Errorf("%w: a transaction of another store, or none", fence.ErrInvalid)
	}
	if tx.done {
		return fmt.Errorf("%w: the transaction has ended", fence.ErrInvalid)
	}
	if err := s.ready(ctx); err != nil {
		return err
	}
	fk := s.k.fence(k)
	r, err := tx.take(ctx, fk, "era", "epoch", "pos", "claimant")
	if err != nil {
		return fmt.Errorf("redisfence: advance %s: %w", k, err)
	}
	if r[0] == "" {
		r = []string{"0", "0", "-1", ""}
	}
	st, err := parseState(r)
	if err != nil {
		return err
	}
	if last, ok := tx.advanced[fk]; ok {
		st.Position = last
	}
	if err := fencecheck.CheckAdvance(k, st, t, first, last); err != nil {
		return err
	}
	tx.advance(k, t, first, last)
	return nil
}

// Recover implements [fence.Sink]: if the stored token equals expected it stores
// Token{Era: expected.Era+1, Epoch: epoch} held by claimant, keeps the position and records a
// [fence.Recovery], in one script; otherwise it fails with [fence.ErrConflict].
func (s *Store) Recover(ctx context.Context, k fence.Key, expected fence.Token, epoch int64, claimant, reason string) (fence.Token, error) {
	if err := fencecheck.ValidateRecover(k, expected, epoch, claimant, reason); err != nil {
		return fence.Token{}, err
	}
	if expected.Era == math.MaxInt64 {
		return fence.Token{}, fmt.Errorf("%w: era %d cannot advance", fence.ErrInvalid, expected.Era)
	}
	if err := s.ready(ctx); err != nil {
		return fence.Token{}, err
	}
	to := fence.Token{Era: expected.Era + 1, Epoch: epoch}
	fk := s.k.fence(k)
	r, err := s.run(ctx, recoverScript, []string{fk, hold(fk), s.k.recovery(k), s.k.partitions(k.Group, k.Topic)},
		i64(expected.Era), i64(expected.Epoch), i64(to.Era), i64(to.Epoch), claimant, reason, i64(int64(k.Partition)))
	if err != nil {
		return fence.Token{}, fmt.Errorf("redisfence: recover %s: %w", k, err)
	}
	if r[0] != "ok" {
		return fence.Token{}, fmt.Errorf("%w: %s: expected %s, stored %s", fence.ErrConflict, k, expected, strings.Join(r[1:], "."))
	}
	return to, nil
}

// Recoveries implements [fence.Sink]: the recorded recoveries of k, oldest first. At is the
// server's clock, to the millisecond.
func (s *Store) Recoveries(ctx context.Context, k fence.Key) ([]fence.Recovery, error) {
	if err := fencecheck.ValidateKey(k); err != nil {
		return nil, err
	}
	if err := s.ready(ctx); err != nil {
		return nil, err
	}
	msgs, err := s.c.XRange(ctx, s.k.recovery(k), "-", "+").Result()
	if err != nil {
		return nil, fmt.Errorf("redisfence: recoveries of %s: %w", k, err)
	}
	out := make([]fence.Recovery, 0, len(msgs))
	for _, m := range msgs {
		r := fence.Recovery{Key: k, Reason: field(m, "reason"), At: idTime(m.ID)}
		var errs [2]error
		r.From, errs[0] = fence.ParseToken(field(m, "from"))
		r.To, errs[1] = fence.ParseToken(field(m, "to"))
		if err := errors.Join(errs[:]...); err != nil {
			return nil, fmt.Errorf("redisfence: recovery %s of %s: %w", m.ID, k, err)
		}
		out = append(out, r)
	}
	return out, nil
}

func field(m redis.XMessage, name string) string {
	v, _ := m.Values[name].(string)
	return v
}

// idTime is the time a stream entry ID ("ms-seq") was given by the server.
func idTime(id string) time.Time {
	ms, _, _ := strings.Cut(id, "-")
	n, _ := strconv.ParseInt(ms, 10, 64)
	return time.UnixMilli(n)
}
