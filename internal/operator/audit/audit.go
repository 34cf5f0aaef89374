package audit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/shard"
	"github.com/batonhq/baton/internal/operator/status"
)

// Check names one of the invariants the auditor judges.
type Check string

// The checks, in the order a pass runs them.
const (
	// Skipped: the sink's position lies within the partition's log (records deleted before
	// they were applied are data loss, with the count), and Kafka's committed offset is never
	// ahead of it.
	Skipped Check = "skipped"
	// Tokens: a fence's stored token never decreases between two observations and is never
	// below a recorded recovery; every era above 0 has its recorded recovery.
	Tokens Check = "tokens"
	// Outbox: a source partition's outbox rows are gap-free from the cursor on, the cursor has
	// not passed a row whose copy never reached the output topics, and the oldest pending row
	// is younger than Config.OutboxAge.
	Outbox Check = "outbox"
	// Delivery: on the output topics, per source partition, no copy carries a sequence the
	// outbox never allocated, and the tokens of first copies never decrease as their sequences
	// rise. Re-published copies are counted, not flagged.
	Delivery Check = "delivery"
	// Inbox: an entity's admitted (token, sequence) never decreases between two observations.
	Inbox Check = "inbox"
	// Liveness: a partition with a lag whose sink position has not moved for longer than
	// Config.Stall.
	Liveness Check = "liveness"
	// Ownership: a fence is held by the member the group assigned its partition to: in a
	// stable group, its claimant names no other member (nor one gone from the group) for
	// longer than Config.Handover; and no member commits offsets on a partition no fence
	// claims (a writer without the fence).
	Ownership Check = "ownership"
)

// Checks lists every check.
var Checks = []Check{Skipped, Tokens, Outbox, Delivery, Inbox, Liveness, Ownership}

// Violation is one broken invariant with its evidence.
type Violation struct {
	Check     Check     `json:"check"`
	Group     string    `json:"group"`
	Topic     string    `json:"topic,omitempty"`
	Partition int32     `json:"partition"`       // -1 for a violation of no partition (an inbox entity)
	Shard     string    `json:"shard,omitempty"` // the shard whose records show it (sharded sinks)
	What      string    `json:"what"`            // what broke, in words
	Evidence  []Field   `json:"evidence"`        // the values that show it: both sides, offsets, sequences
	At        time.Time `json:"at"`              // when the auditor first saw it
	id        string    // identity: a violation is counted and logged once
}

// Field is one piece of a violation's evidence.
type Field struct {
	Name  string `json:"name"`
	Value any    `json:"value"`
}

func (v Violation) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", v.Check, v.What)
	if v.Topic != "" {
		fmt.Fprintf(&b, " (%s/%s/%d)", v.Group, v.Topic, v.Partition)
	}
	if v.Shard != "" {
		fmt.Fprintf(&b, " on shard %s", v.Shard)
	}
	for _, f := range v.Evidence {
		fmt.Fprintf(&b, " %s=%v", f.Name, f.Value)
	}
	return b.String()
}

// Config says what to audit and the bounds of the judgements and of the auditor's own load.
type Config struct {
	Brokers []string // Kafka seed brokers
	Store   string   // a PostgreSQL URL or an SQLite file path (status.ParseStore)
	// Shards are a sharded sink's databases (fence/shard), home shard first; when given, Store
	// is not read. Each shard's fences, outbox and inbox are audited; a fence is judged on the
	// shard the placement puts its partition on, and a fence retired by a move is not judged.
	Shards []status.ShardAddr
	Group  string        // the consumer group whose records are audited
	Topics []string      // optional: only these source topics (default every topic the group has state for)
	Tables status.Tables // the stores' table names (default the stores' defaults)
	// OutputTopics are the outbox's destination topics, read incrementally from their start for
	// the Delivery check and the Outbox check's cursor-past-delivery judgement (both skipped
	// without them).
	OutputTopics []string
	Timeout      time.Duration // bounds each source's requests (default 5s)
	OutboxAge    time.Duration // the oldest pending outbox row's age bound (default 5m)
	Stall        time.Duration // how long a lagging partition's position may stand still (default 5m)
	// Handover bounds how long, in a stable group, a partition's fence may stay held by a
	// claimant that is not the partition's owner (default 1m). A consumer claims a partition
	// when it is assigned, before it reads a record, so the window is one claim statement (a
	// regression's recovery adds the coordinator's proof, a held transaction the database's
	// end of it): seconds. Every pass in between must have read both sources in a stable
	// group, so a rebalance, or a source out of reach, starts the count again.
	Handover  time.Duration
	MaxBytes  int64        // bytes read from the output topics per pass (default 64 MiB)
	InboxRows int          // inbox admissions read per pass, a page of the keyed table (default 10000)
	KgoOpts   []kgo.Opt    // extra franz-go options (TLS, SASL, ...)
	Logger    *slog.Logger // where violations are logged (default slog.Default())
	Meter     metric.MeterProvider
	Now       func() time.Time // the clock (default time.Now)
}

// Report is what one pass found.
type Report struct {
	At         time.Time   `json:"at"`
	Took       string      `json:"took"`
	Violations []Violation `json:"violations"` // found in this pass, new or still present
	New        int         `json:"new"`        // of those, first seen in this pass
	Queries    int64       `json:"queries"`    // statements sent to the store in this pass
	Requests   int64       `json:"kafka_requests"`
	Partitions int         `json:"partitions"` // fences judged: 0 when the store has none for the group
	Owned      int         `json:"owned"`      // of those, fences whose claimant was compared with the group's owner
	BytesRead  int64       `json:"bytes_read"` // from the output topics in this pass
	// Republished counts copies on the output topics whose sequence was seen before in this
	// pass (a relay's at-least-once re-publish, which the inbox drops).
	Republished int64    `json:"republished"`
	CaughtUp    bool     `json:"output_caught_up"` // the output topics were read to their end
	Errors      []string `json:"errors,omitempty"`
	// Shards reports each database of a sharded sink (Config.Shards), home first.
	Shards []ShardReport `json:"shards,omitempty"`
	// Recreated lists the source topics recreated under the same name and not yet reset
	// ('baton topics reset'): the brokers' topic ID is not the one stored with the fences, so
	// the fences' positions (the old incarnation's) were not compared with the new one's log
	// (their Skipped and Liveness checks not judged in this pass).
	Recreated []RecreatedTopic `json:"recreated,omitempty"`
}

// RecreatedTopic is a source topic whose fences a pass did not judge against the log: its
// positions and the brokers' offsets belong to different incarnations of the topic.
type RecreatedTopic struct {
	Topic    string `json:"topic"`
	StoredID string `json:"stored_id"` // the incarnation the fences' positions belong to
	BrokerID string `json:"broker_id"` // the incarnation whose offsets the brokers listed
	Fences   int    `json:"fences"`    // fences whose log was not judged
}

// ShardReport is what a pass read from one shard of a sharded sink.
type ShardReport struct {
	Name       string `json:"name"`
	Addr       string `json:"addr"`       // its address, without a password
	Partitions int    `json:"partitions"` // fences judged there: those the placement puts on it
	Retired    int    `json:"retired"`    // fences retired by a move, not judged
	Queries    int64  `json:"queries"`
	Violations int    `json:"violations"`      // found in its records
	Error      string `json:"error,omitempty"` // why it could not be read
}

// Auditor judges a group's records, one pass at a time. Pass is not safe for concurrent use;
// Violations and ServeHTTP are.
type Auditor struct {
	cfg  Config
	col  *status.Collector
	out  *outputReader
	log  *slog.Logger
	tel  telemetry
	now  func() time.Time
	seen map[string]bool // violation ids counted and logged

	parts  map[fence.Key]*partState
	srcs   map[fence.Key]*sourceState
	inbox  map[string]status.Admission // last observed admission per scope/id
	inPage map[string][2]string        // per shard, where the next inbox page starts
	pass   int64                       // the number of the current pass
	owns   map[fence.Key]*ownState     // fences held by a claimant that is not the owner
	commit map[fence.Key]int64         // committed offsets of partitions no fence claims

	mu     sync.Mutex
	last   *Report
	recent []Violation // first sightings, newest first
}

type partState struct {
	tok         fence.Token
	pos         int64
	otherLog    bool      // pos was read while the brokers' offsets were another incarnation's: never compared with a log
	progressAt  time.Time // the last time the position moved or the partition had no lag
	progressHWM int64     // the high watermark then (-1: not known yet)
}

type telemetry struct {
	violations, passes, queries, bytes, republished metric.Int64Counter
}

// New validates cfg and returns an auditor. It does no I/O.
func New(cfg Config) (*Auditor, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.OutboxAge <= 0 {
		cfg.OutboxAge = 5 * time.Minute
	}
	if cfg.Stall <= 0 {
		cfg.Stall = 5 * time.Minute
	}
	if cfg.Handover <= 0 {
		cfg.Handover = time.Minute
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = 64 << 20
	}
	if cfg.InboxRows <= 0 {
		cfg.InboxRows = 10000
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Meter == nil {
		cfg.Meter = otel.GetMeterProvider()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	col, err := status.NewCollector(status.Config{Brokers: cfg.Brokers, Store: cfg.Store, Shards: cfg.Shards, Group: cfg.Group,
		Topics: cfg.Topics, Tables: cfg.Tables, Timeout: cfg.Timeout, KgoOpts: cfg.KgoOpts})
	if err != nil {
		return nil, err
	}
	a := &Auditor{cfg: cfg, col: col, log: cfg.Logger, now: cfg.Now, seen: map[string]bool{},
		parts: map[fence.Key]*partState{}, srcs: map[fence.Key]*sourceState{}, inbox: map[string]status.Admission{}, inPage: map[string][2]string{}}
	if len(cfg.OutputTopics) > 0 {
		a.out, err = newOutputReader(cfg)
		if err != nil {
			col.Close()
			return nil, err
		}
	}
	m := cfg.Meter.Meter("github.com/batonhq/baton/internal/operator/audit")
	a.tel.violations, err = m.Int64Counter("baton.audit.violations", metric.WithDescription("Invariant violations the auditor found, each counted once, by check"))
	if err == nil {
		a.tel.passes, err = m.Int64Counter("baton.audit.passes", metric.WithDescription("Audit passes, by outcome (ok: every source read; error)"))
	}
	if err == nil {
		a.tel.queries, err = m.Int64Counter("baton.audit.queries", metric.WithDescription("Statements the auditor sent to the store"))
	}
	if err == nil {
		a.tel.bytes, err = m.Int64Counter("baton.audit.bytes_read", metric.WithUnit("By"), metric.WithDescription("Bytes the auditor read from the output topics"))
	}
	if err == nil {
		a.tel.republished, err = m.Int64Counter("baton.audit.republished", metric.WithDescription("Re-published copies seen on the output topics (counted, not violations)"))
	}
	if err != nil {
		a.Close()
		return nil, fmt.Errorf("audit: instruments: %w", err)
	}
	return a, nil
}

// Close releases the clients.
func (a *Auditor) Close() {
	a.col.Close()
	if a.out != nil {
		a.out.close()
	}
}

// Config returns the configuration, defaults filled in.
func (a *Auditor) Config() Config { return a.cfg }

// Run makes a pass every interval until ctx ends, and returns nil then. A pass that cannot read
// a source is logged and counted (baton.audit.passes{outcome="error"}); the next one tries again.
func (a *Auditor) Run(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		return errors.New("audit: the interval must be positive")
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := a.Pass(ctx); err != nil && ctx.Err() == nil {
			a.log.Warn("audit pass could not read every source; the checks it could not feed were skipped", "group", a.cfg.Group, "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Last returns the last pass's report (nil before the first) and the recent first sightings,
// newest first.
func (a *Auditor) Last() (*Report, []Violation) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.last, slices.Clone(a.recent)
}

// Pass reads every source once and judges every check it could feed. The sources are read in
// an order that leaves no race with the members: Kafka's committed and log start offsets
// before the sink's positions (each only rises, so a committed offset ahead of a position read
// after it, or a log start past it, is real), the brokers' topic IDs after those offsets and the
// IDs stored with the fences before the fences (so positions of an older incarnation of the
// topic than the offsets' show two IDs, and are not judged: storeChecks says why), the store
// before the output topics' end offsets (so every copy the cursor says is delivered lies below
// them). It returns the report and the joined errors of the sources it could not read.
func (a *Auditor) Pass(ctx context.Context) (*Report, error) {
	now := a.now()
	a.pass++
	r := &Report{At: now.UTC()}
	var found []Violation
	add := func(v Violation) { found = append(found, v) }
	var errs []error

	// The topics the fences named at the last pass: their offsets are read before the fences.
	var topics []string
	for k := range a.parts {
		if !slices.Contains(topics, k.Topic) {
			topics = append(topics, k.Topic)
		}
	}
	kv, kerr := a.col.Kafka(ctx, topics)
	r.Requests += 6 // ping, the group, its offsets, the end and start offsets, the topics' IDs
	if kerr != nil {
		errs = append(errs, kerr)
	}
	serr := a.storesChecks(ctx, kv, now, r, add)
	if serr != nil {
		errs = append(errs, serr)
	}
	if a.out != nil && serr == nil {
		oerr := a.out.read(ctx, r, func(c copyRecord) { a.copySeen(c, r, add) })
		if oerr != nil {
			errs = append(errs, oerr)
		} else if r.CaughtUp {
			a.judgeHoles(add)
		}
	}

	r.New = a.record(ctx, found)
	r.Violations = found
	if r.Violations == nil {
		r.Violations = []Violation{}
	}
	for _, e := range errs {
		r.Errors = append(r.Errors, e.Error())
	}
	r.Took = a.now().Sub(now).String()
	outcome := "ok"
	if len(errs) > 0 {
		outcome = "error"
	}
	a.tel.passes.Add(ctx, 1, metric.WithAttributes(attribute.String("outcome", outcome), attribute.String("group", a.cfg.Group)))
	a.tel.queries.Add(ctx, r.Queries, metric.WithAttributes(attribute.String("group", a.cfg.Group)))
	a.tel.bytes.Add(ctx, r.BytesRead, metric.WithAttributes(attribute.String("group", a.cfg.Group)))
	a.tel.republished.Add(ctx, r.Republished, metric.WithAttributes(attribute.String("group", a.cfg.Group)))
	a.mu.Lock()
	a.last = r
	a.mu.Unlock()
	return r, errors.Join(errs...)
}

// record counts, logs and remembers the violations not seen before, and returns how many.
func (a *Auditor) record(ctx context.Context, found []Violation) int {
	n := 0
	for i := range found {
		v := &found[i]
		if v.id == "" {
			v.id = fmt.Sprintf("%s/%s/%d/%s", v.Check, v.Topic, v.Partition, v.What)
		}
		if a.seen[v.id] {
			continue
		}
		a.seen[v.id] = true
		n++
		attrs := []attribute.KeyValue{attribute.String("check", string(v.Check)), attribute.String("group", v.Group)}
		if v.Topic != "" {
			attrs = append(attrs, attribute.String("topic", v.Topic), attribute.Int("partition", int(v.Partition)))
		}
		a.tel.violations.Add(ctx, 1, metric.WithAttributes(attrs...))
		args := []any{"check", string(v.Check), "group", v.Group}
		if v.Topic != "" {
			args = append(args, "topic", v.Topic, "partition", v.Partition)
		}
		for _, f := range v.Evidence {
			args = append(args, f.Name, f.Value)
		}
		a.log.Error("audit: "+v.What, args...)
		a.mu.Lock()
		a.recent = append([]Violation{*v}, a.recent...)
		if len(a.recent) > maxRecent {
			a.recent = a.recent[:maxRecent]
		}
		a.mu.Unlock()
	}
	return n
}

const maxRecent = 200

// byKey groups recoveries by their fence, oldest first as read.
func byKey(recs []fence.Recovery) map[fence.Key][]fence.Recovery {
	m := map[fence.Key][]fence.Recovery{}
	for _, r := range recs {
		m[r.Key] = append(m[r.Key], r)
	}
	return m
}

// eraIn reports whether tok's era is era 0 (never recovered) or one a recovery moved to.
func eraIn(tok fence.Token, recs []fence.Recovery) bool {
	if tok.Era == 0 {
		return true
	}
	for _, r := range recs {
		if r.To.Era == tok.Era {
			return true
		}
	}
	return false
}

// violation builds a violation of partition k.
func violation(c Check, k fence.Key, at time.Time, id, what string, ev ...Field) Violation {
	return Violation{Check: c, Group: k.Group, Topic: k.Topic, Partition: k.Partition, What: what, Evidence: ev, At: at.UTC(),
		id: fmt.Sprintf("%s/%s/%s/%d/%s", c, k.Topic, what, k.Partition, id)}
}

func f(name string, v any) Field { return Field{Name: name, Value: v} }

// storesChecks reads every shard's store (the one database without shards) and judges the
// checks they feed, then the Ownership check over the fences of every shard. A shard that
// cannot be read is named in the error; the others are still judged.
func (a *Auditor) storesChecks(ctx context.Context, kv *status.KafkaState, now time.Time, r *Report, add func(Violation)) error {
	var errs []error
	ss := a.col.Shards(ctx)
	// Which shard judges a fence: the placement's (read from the home shard). Without it, each
	// shard judges the fences it holds that are not retired.
	sctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	pl, perr := a.col.Placement(sctx, ss[0].Store)
	cancel()
	var placement *shard.Placement
	if perr == nil {
		placement = &pl
	} else if ss[0].Store != nil {
		errs = append(errs, perr)
	}
	held := map[fence.Key]status.Fence{} // the fences judged
	present := map[fence.Key]bool{}      // every fence row, on any shard, retired or not
	allRead := true                      // every shard's fence rows are in present
	inc := &incarnations{recreated: map[string]*RecreatedTopic{}}
	if kv != nil {
		inc.broker = kv.TopicID
	}
	for i, sh := range ss {
		rep := ShardReport{Name: sh.Name, Addr: sh.Addr}
		err := sh.Err
		if err == nil {
			q0 := sh.Store.Queries()
			count := 0
			sctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
			scope := shardScope{name: sh.Name, placement: placement, home: i == 0}
			read := false
			err = a.storeChecks(sctx, sh.Store, scope, kv, inc, now, &rep, held, present, &read, func(v Violation) { count++; v.Shard = sh.Name; add(v) })
			allRead = allRead && read
			cancel()
			rep.Queries = sh.Store.Queries() - q0
			rep.Violations = count
			r.Queries += rep.Queries
			r.Partitions += rep.Partitions
			if err != nil {
				a.col.DropShard(i)
				if sh.Name != "" {
					err = fmt.Errorf("shard %s: %w", sh.Name, err)
				}
			}
		}
		if sh.Err != nil {
			allRead = false
		}
		if err != nil {
			rep.Error = err.Error()
			errs = append(errs, err)
		}
		if a.col.Sharded() {
			r.Shards = append(r.Shards, rep)
		}
	}
	if kv != nil {
		a.ownershipChecks(held, present, allRead, kv, func(topic string) bool { return a.want(topic) }, now, r, add)
	}
	for _, t := range slices.Sorted(maps.Keys(inc.recreated)) {
		r.Recreated = append(r.Recreated, *inc.recreated[t])
	}
	return errors.Join(errs...)
}

// incarnations tells which topics' fences a pass compares with the brokers' offsets: those
// whose positions belong to the incarnation the offsets were listed from, as far as the topic
// IDs tell.
type incarnations struct {
	broker    map[string]string // the brokers' topic IDs, read after the offsets
	home      map[string]string // the IDs the home shard stores, read before any shard's fences
	recreated map[string]*RecreatedTopic
}

// other reports whether the positions of topic's fences, whose stored IDs (read before the
// fences) are stored, belong to another incarnation than the brokers' offsets. A shard that
// stores no identity for the topic was never reset: its fences hold the incarnation the home
// shard stores (a reset changes the other shards first, the home shard last). Either ID
// unknown: the same incarnation, as far as anyone can tell.
func (in *incarnations) other(topic string, stored map[string]string) (storedID, brokerID string, other bool) {
	storedID, ok := stored[topic]
	if !ok {
		storedID = in.home[topic]
	}
	brokerID = in.broker[topic]
	return storedID, brokerID, storedID != "" && brokerID != "" && storedID != brokerID
}

func (a *Auditor) want(topic string) bool {
	return len(a.cfg.Topics) == 0 || slices.Contains(a.cfg.Topics, topic)
}

// shardScope says which of a shard's records it judges.
type shardScope struct {
	name      string           // "" for the one database of an auditor without shards
	placement *shard.Placement // nil when it could not be read
	home      bool             // the home shard (or the one database), read first
}

// judges reports whether the shard judges k's records: the placement puts k there, or,
// without a placement, always (its fence, if it has one, is not retired).
func (s shardScope) judges(k fence.Key) bool {
	return s.placement == nil || s.placement.Shard(k) == s.name
}

// storeChecks reads one shard's store and judges the checks it feeds: Skipped, Tokens and
// Liveness against the Kafka state read before it (nil when Kafka could not be read), Outbox,
// and Inbox. It records in held the fences it judged and in present every fence row it read,
// and in inc the topics whose fences' positions it did not compare with the log; it sets
// fencesRead once every fence row of the shard is in present.
func (a *Auditor) storeChecks(ctx context.Context, st *status.Store, scope shardScope, kv *status.KafkaState, inc *incarnations, now time.Time, rep *ShardReport, held map[fence.Key]status.Fence, present map[fence.Key]bool, fencesRead *bool, add func(Violation)) error {
	// The recoveries are read before the fences: a recovery moves its fence and records itself
	// in one transaction, so every recovery read is already in the fences read after it, and a
	// fence below one of them went back. The other way round, a recovery made between the two
	// reads would show a fence below it that is not.
	recs, err := st.Recoveries(ctx, a.cfg.Group)
	if err != nil && !errors.Is(err, status.ErrNotFound) {
		return err
	}
	// The topic IDs stored with the fences are read before the fences, the brokers' after the
	// offsets (by a metadata request of its own: a cached answer may predate them), and a
	// fence's log is judged only when the two are the same. A reset moves the
	// stored ID and every fence of the topic to a new era with no position in one transaction,
	// and a claimant applies only while the stored ID is the brokers', so a position read is of
	// the stored incarnation then or of a later one; the offsets are of the brokers' then or
	// of an earlier one. Each ID only moves on to new incarnations (a new ID never comes back),
	// so positions of an older incarnation than the offsets' (a topic recreated and not yet
	// reset: the fences hold the old offsets) show a stored ID other than the brokers', in any
	// interleaving. The other way round, a stored ID read after the fences could be a reset's,
	// made after the old positions were read, and the brokers' read before the offsets could
	// be the incarnation before theirs: either would compare one incarnation's positions with
	// another's log. What this order lets through needs a recreation, a reset and a new
	// owner's applied records all between the offsets and the fences: a new position under a
	// new era (so compared with no earlier position, and the committed offset given its
	// interval) below the old incarnation's log start. What it holds back is one pass at a
	// recreation or reset made while it reads, and every pass while a recreated topic waits
	// for its reset.
	var stored map[string]string
	if kv != nil {
		var topics []string
		for _, t := range slices.Sorted(maps.Keys(kv.TopicID)) {
			if a.want(t) {
				topics = append(topics, t)
			}
		}
		if stored, err = st.TopicIDs(ctx, a.cfg.Group, topics); err != nil {
			return err
		}
		if scope.home {
			inc.home = stored
		}
	}
	fences, err := st.Fences(ctx, a.cfg.Group)
	if err != nil && !errors.Is(err, status.ErrNotFound) {
		return err
	}
	want := a.want
	recovered := byKey(recs)
	// A fence whose era a recovery made between the two reads has its record after the first:
	// read them again, only then, to tell that from an era nobody recorded.
	eras := recovered
	for _, fr := range fences {
		k := fence.Key{Group: a.cfg.Group, Topic: fr.Topic, Partition: fr.Partition}
		if want(fr.Topic) && !eraIn(fr.Token, recovered[k]) {
			later, err := st.Recoveries(ctx, a.cfg.Group)
			if err != nil && !errors.Is(err, status.ErrNotFound) {
				return err
			}
			eras = byKey(later)
			break
		}
	}
	for _, fr := range fences {
		if !want(fr.Topic) {
			continue
		}
		k := fence.Key{Group: a.cfg.Group, Topic: fr.Topic, Partition: fr.Partition}
		present[k] = true
		if fr.Retired() {
			// Retired by a move: it refuses every claim and write for ever, its position
			// stands where the key left the shard, and its claimant is no member.
			rep.Retired++
			continue
		}
		if _, judged := held[k]; judged || !scope.judges(k) {
			// A copy on the shard a move is bringing the key to, before it is published; or,
			// without the placement, a second live fence of the key: judged once, where first
			// found, so that one fence's state is never compared with another's.
			continue
		}
		rep.Partitions++
		held[k] = fr
		prev := a.parts[k]
		other := false
		if kv != nil {
			var sid, bid string
			if sid, bid, other = inc.other(fr.Topic, stored); other {
				rt := inc.recreated[fr.Topic]
				if rt == nil {
					rt = &RecreatedTopic{Topic: fr.Topic, StoredID: sid, BrokerID: bid}
					inc.recreated[fr.Topic] = rt
				}
				rt.Fences++
			}
		}
		if kv != nil && !other {
			logPrev := prev
			if prev != nil && prev.otherLog {
				p := *prev
				p.pos = fence.NoPosition
				logPrev = &p
			}
			for _, v := range judgeLog(k, fr.Token, fr.Position, logPrev, kv, now) {
				add(v)
			}
		}
		for _, v := range judgeToken(k, fr.Token, prev, recovered[k], eras[k], now) {
			add(v)
		}
		cur := &partState{tok: fr.Token, pos: fr.Position, progressAt: now, progressHWM: -1, otherLog: other}
		if prev != nil && !other && prev.pos == fr.Position && prev.tok.Era == fr.Token.Era {
			cur.progressAt, cur.progressHWM = prev.progressAt, prev.progressHWM
		}
		if kv != nil && !other {
			if hwm, ok := kv.HighWatermark[k]; ok {
				if cur.progressHWM < 0 {
					cur.progressHWM = hwm
				}
				if lag := hwm - (fr.Position + 1); lag <= 0 {
					cur.progressAt, cur.progressHWM = now, hwm
				} else if v, ok := judgeStall(k, fr.Position, hwm, cur.progressAt, cur.progressHWM, now, a.cfg.Stall); ok {
					add(v)
				}
			}
		}
		a.parts[k] = cur
	}
	*fencesRead = true

	cursors, err := st.OutboxCursors(ctx, a.cfg.Group)
	if err != nil {
		return err
	}
	var low int64 = -1
	for _, c := range cursors {
		k := fence.Key{Group: a.cfg.Group, Topic: c.Topic, Partition: c.Partition}
		if !want(c.Topic) || !scope.judges(k) {
			continue
		}
		v, gap := judgeOutbox(k, c, now, a.cfg.OutboxAge)
		for _, x := range v {
			add(x)
		}
		if gap {
			// The evidence of a gap: the first missing sequence, from a bounded read.
			seqs, err := st.OutboxSeqs(ctx, k, c.Delivered, maxGapScan)
			if err != nil {
				return err
			}
			miss, ok := firstMissing(c.Delivered, seqs)
			if !ok {
				miss = -1 // beyond the bounded read
			}
			add(violation(Outbox, k, now, fmt.Sprint(miss), "outbox row missing above the cursor",
				f("first_missing_seq", miss), f("delivered_seq", c.Delivered), f("last_seq", c.LastSeq),
				f("rows_pending", c.Pending), f("rows_allocated", c.LastSeq-c.Delivered)))
		}
		if a.out != nil {
			s := a.source(k, c)
			s.cursor = c
			if low < 0 || s.contig < low {
				low = s.contig
			}
		}
	}
	if a.out != nil && low >= 0 {
		dl, err := st.DeadLettered(ctx, a.cfg.Group, low)
		if err != nil {
			return err
		}
		for k, seqs := range dl {
			if s := a.srcs[k]; s != nil {
				s.dead = seqs
			}
		}
		// Copies read in earlier passes were produced before this cursor was read: a sequence
		// above its last allocated one was never appended.
		for k, s := range a.srcs {
			for _, v := range judgeBeyond(k, s, now) {
				add(v)
			}
		}
	}
	return a.inboxChecks(ctx, st, scope.name, now, add)
}

// ownershipChecks judges the Ownership check over the fences read (held) and the Kafka state
// read before them. A committed offset that moved is judged against the fence rows present
// only when every shard's were read (allRead): a partition missing from a read that failed
// part of the way has its fence all the same. Until then the offsets last judged stay the
// ones the next pass compares with (a commit after them still follows its claim, made before
// the fences are read).
func (a *Auditor) ownershipChecks(held map[fence.Key]status.Fence, present map[fence.Key]bool, allRead bool, kv *status.KafkaState, want func(string) bool, now time.Time, r *Report, add func(Violation)) {
	owns := map[fence.Key]*ownState{}
	for k, fr := range held {
		owner := kv.Owner[k]
		if owner == nil || kv.State != "Stable" {
			continue
		}
		cur, compared, v, bad := judgeOwner(k, fr, owner, kv.Members, a.owns[k], a.pass, now, a.cfg.Handover)
		if compared {
			r.Owned++
		}
		if bad {
			add(v)
		}
		if cur != nil {
			owns[k] = cur
		}
	}
	a.owns = owns
	if !allRead {
		return
	}
	commit := map[fence.Key]int64{}
	for k, c := range kv.Committed {
		if present[k] || !want(k.Topic) {
			continue
		}
		if prev, ok := a.commit[k]; ok {
			if v, bad := judgeUnclaimed(k, prev, c, kv.Owner[k], now); bad {
				add(v)
			}
		}
		commit[k] = c
	}
	a.commit = commit
}

// maxGapScan bounds the read that finds an outbox gap's first missing sequence.
const maxGapScan = 10000

// inboxChecks reads the next page of the keyed table and compares each admission with the one
// observed before.
func (a *Auditor) inboxChecks(ctx context.Context, st *status.Store, shardName string, now time.Time, add func(Violation)) error {
	at := a.inPage[shardName]
	page, err := st.Admissions(ctx, at[0], at[1], a.cfg.InboxRows)
	if err != nil {
		return err
	}
	if len(page) < a.cfg.InboxRows {
		delete(a.inPage, shardName) // the next pass starts again at the beginning
	} else {
		last := page[len(page)-1]
		a.inPage[shardName] = [2]string{last.Scope, last.ID}
	}
	for _, ad := range page {
		key := shardName + "\x00" + ad.Scope + "\x00" + ad.ID
		if prev, ok := a.inbox[key]; ok {
			if v, bad := judgeAdmission(a.cfg.Group, prev, ad, now); bad {
				add(v)
			}
		}
		a.inbox[key] = ad
	}
	return nil
}
