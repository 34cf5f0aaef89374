package status

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
)

// Config says where a group's state lives.
type Config struct {
	Brokers []string // Kafka seed brokers
	Store   string   // a PostgreSQL URL or an SQLite file path (see ParseStore)
	// Shards are a sharded sink's databases (fence/shard), home shard first; when given,
	// Store is not read. Every command reads each of them, and the placement stored in the
	// home shard says which one a partition's line comes from.
	Shards []ShardAddr
	Group  string   // the consumer group
	Topics []string // optional: only these topics (default: every topic the group has state for)
	Tables Tables   // the stores' table names (default the stores' defaults)
	// Timeout bounds each source's requests (default 5s), so an unreachable source costs at
	// most this long and is then reported as unreachable.
	Timeout time.Duration
	// KgoOpts are extra franz-go options (TLS, SASL, ...), appended after the seed brokers.
	KgoOpts []kgo.Opt
}

// Member is a live member of the group, as the group coordinator describes it.
type Member struct {
	MemberID   string `json:"member_id"`
	InstanceID string `json:"instance_id,omitempty"`
	ClientID   string `json:"client_id"`
	Host       string `json:"host"`
}

// String names the member for an operator: client id and host.
func (m *Member) String() string {
	if m == nil {
		return "-"
	}
	s := m.ClientID
	if m.InstanceID != "" {
		s = m.InstanceID
	}
	return s + "@" + strings.TrimPrefix(m.Host, "/")
}

// Recovery is a recorded era advance.
type Recovery struct {
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	From      string    `json:"from"`
	To        string    `json:"to"`
	Reason    string    `json:"reason"`
	At        time.Time `json:"at"`
	Shard     string    `json:"shard,omitempty"` // the shard it is recorded on (sharded sinks)
	// Kind is KindHandover, KindRegression or KindOperator (RecoveryKind).
	Kind string `json:"kind"`
}

// The kinds of recorded era advance.
const (
	// KindHandover: the consumer fenced its own member's previous claimant at the same
	// generation (a static member restarted within its session, a KIP-848 member rejoined in
	// place). Routine: not a regression.
	KindHandover = "handover"
	// KindRegression: the consumer recovered after the group's generations went backwards
	// (the group was deleted or recreated), verified with the coordinator.
	KindRegression = "regression"
	// KindOperator: an operator's recover, topics reset or topics ack.
	KindOperator = "operator"
)

// RecoveryKind classifies a recorded era advance from what the store holds: an operator's
// reason does not start as the consumer's; the consumer's is a handover when the new token keeps
// the stored one's generation (it fenced a claimant of the same generation: its own member's
// previous worker), and a regression when the generation differs (the stored token was ahead
// of the verified owner's).
func RecoveryKind(reason string, from, to fence.Token) string {
	switch {
	case !IsAutomatic(reason):
		return KindOperator
	case from.Epoch == to.Epoch || strings.Contains(reason, ": handover at generation "):
		return KindHandover
	}
	return KindRegression
}

// Partition is one partition's line. A nil pointer is a value no reachable source had.
type Partition struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// Shard is the shard the placement puts the partition on, where its line's fence and
	// outbox values come from (sharded sinks only).
	Shard string `json:"shard,omitempty"`
	// Retired: the fence on Shard is retired (a move under way: the next placement puts the
	// partition elsewhere); no member can claim or write it.
	Retired bool `json:"retired,omitempty"`
	// Elsewhere are the partition's fence rows on shards the placement does not put it on:
	// retired ones left by a move, never a second owner.
	Elsewhere     []ShardFence `json:"elsewhere,omitempty"`
	Owner         *Member      `json:"owner"`
	Token         string       `json:"token,omitempty"` // the fence's stored token, era.epoch; "" without a fence row
	Position      *int64       `json:"position"`        // the sink's last applied offset (-1: none)
	Committed     *int64       `json:"committed"`       // Kafka's committed offset (the next to read)
	HighWatermark *int64       `json:"high_watermark"`  // the partition's end offset
	Lag           *int64       `json:"lag"`             // records produced and not applied: high watermark - (position+1), or - committed without a fence
	Backlog       *int64       `json:"outbox_backlog"`  // outbox rows appended and not delivered
	LastRecovery  *Recovery    `json:"last_recovery"`   // the partition's latest recorded recovery
	// LogStart is the partition's log start offset; Lost, when the log starts after the
	// sink's position + 1, the records deleted (retention, truncation) before they were
	// applied: data loss, also logged at ERROR and counted (baton.consumer.records.lost) by
	// the consumer that resumes there.
	LogStart *int64 `json:"log_start,omitempty"`
	Lost     *int64 `json:"lost,omitempty"`
}

// Source is one place status reads from, and whether it answered.
type Source struct {
	Name string `json:"name"` // "kafka", "store"
	Addr string `json:"addr"`
	Err  string `json:"error,omitempty"`
}

// Summary totals a snapshot.
type Summary struct {
	Members    int   `json:"members"`
	Owned      int   `json:"owned"`
	Unowned    int   `json:"unowned"`
	TotalLag   int64 `json:"total_lag"`
	Backlog    int64 `json:"outbox_backlog"`
	Recoveries int   `json:"recoveries"`
	// Regressions are the recoveries the consumer made itself after verifying a generation
	// that went backwards (RecoverRegressions); Handovers those it made to fence its own
	// member's previous claimant at the same generation; the others were made by an operator.
	Regressions int `json:"regressions"`
	Handovers   int `json:"handovers"`
	// The stores do not record stale refusals: they refuse and roll back, leaving no row.
	// They are counted by the members' baton.consumer.stale_refusals metric.
}

// Snapshot is the state of one group at one time.
type Snapshot struct {
	Group      string        `json:"group"`
	At         time.Time     `json:"at"`
	Took       time.Duration `json:"took_ns"`
	GroupState string        `json:"group_state,omitempty"` // the coordinator's: Stable, Empty, Dead (no such group), ...
	// Shards names a sharded sink's databases, home first, and Placement the version of the
	// placement read from the home shard (0: not read).
	Shards     []string    `json:"shards,omitempty"`
	Placement  int64       `json:"placement_version,omitempty"`
	Sources    []Source    `json:"sources"`
	Members    []Member    `json:"members"`
	Partitions []Partition `json:"partitions"`
	Recoveries []Recovery  `json:"recoveries"`
	Summary    Summary     `json:"summary"`
}

// Partition returns the line of topic/partition, or nil.
func (s *Snapshot) Partition(topic string, p int32) *Partition {
	for i := range s.Partitions {
		if s.Partitions[i].Topic == topic && s.Partitions[i].Partition == p {
			return &s.Partitions[i]
		}
	}
	return nil
}

// Collector reads snapshots of one group. It keeps its Kafka client and reopens the store
// after a failure, so a long-running page survives a restart of either.
type Collector struct {
	cfg    Config
	kcl    *kgo.Client
	adm    *kadm.Client
	stores []*Store // one per shard (cfg.shards()), nil until opened
}

// NewCollector validates cfg and returns a Collector. It does no I/O.
func NewCollector(cfg Config) (*Collector, error) {
	var errs []error
	if len(cfg.Brokers) == 0 {
		errs = append(errs, errorf(ErrUsage, "no brokers given"))
	}
	if cfg.Group == "" {
		errs = append(errs, errorf(ErrUsage, "no consumer group given"))
	}
	seen := map[string]bool{}
	for _, sh := range cfg.shards() {
		if _, _, err := ParseStore(sh.Store); err != nil {
			errs = append(errs, err)
		}
		if len(cfg.Shards) > 0 && (sh.Name == "" || seen[sh.Name]) {
			errs = append(errs, errorf(ErrUsage, "shard name %q is empty or given twice", sh.Name))
		}
		seen[sh.Name] = true
	}
	cfg.Tables = cfg.Tables.withDefaults()
	errs = append(errs, cfg.Tables.validate())
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	opts := append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...), kgo.DialTimeout(cfg.Timeout), kgo.RequestRetries(1)}, cfg.KgoOpts...)
	kcl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, errorf(ErrUsage, "kafka client: %v", err)
	}
	return &Collector{cfg: cfg, kcl: kcl, adm: kadm.NewClient(kcl), stores: make([]*Store, len(cfg.shards()))}, nil
}

// Close releases the clients.
func (c *Collector) Close() {
	c.kcl.Close()
	for i := range c.stores {
		c.DropShard(i)
	}
}

// Config returns the collector's configuration (defaults filled in).
func (c *Collector) Config() Config { return c.cfg }

func (c *Collector) brokers() string { return strings.Join(c.cfg.Brokers, ",") }

// openStore returns shard i's store, opening it if needed.
func (c *Collector) openStore(ctx context.Context, i int) (*Store, error) {
	if c.stores[i] != nil {
		return c.stores[i], nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	s, err := OpenStore(ctx, c.cfg.shards()[i].Store, c.cfg.Tables, ReadOnly)
	if err != nil {
		return nil, err
	}
	c.stores[i] = s
	return s, nil
}

// kafkaView is what the brokers say about the group.
type kafkaView struct {
	state     string
	members   []Member
	owner     map[fence.Key]*Member
	committed map[fence.Key]int64
	hwm       map[fence.Key]int64
	start     map[fence.Key]int64 // log start offsets
	topics    map[string]bool     // topics the brokers know
}

func (c *Collector) readKafka(ctx context.Context, extraTopics []string) (*kafkaView, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	if err := c.kcl.Ping(ctx); err != nil {
		return nil, errorf(ErrUnreachable, "Kafka at %s did not answer within %s: %v", c.brokers(), c.cfg.Timeout, err)
	}
	v := &kafkaView{owner: map[fence.Key]*Member{}, committed: map[fence.Key]int64{}, hwm: map[fence.Key]int64{}, start: map[fence.Key]int64{}, topics: map[string]bool{}}
	groups, err := c.adm.DescribeGroups(ctx, c.cfg.Group)
	if err != nil {
		return nil, errorf(ErrUnreachable, "Kafka at %s: describing group %q: %v", c.brokers(), c.cfg.Group, err)
	}
	g := groups[c.cfg.Group]
	if errors.Is(g.Err, kerr.GroupIDNotFound) {
		g.Err, g.State = nil, "Dead"
	}
	if g.Err != nil {
		return nil, errorf(ErrUnreachable, "Kafka at %s: describing group %q: %v", c.brokers(), c.cfg.Group, g.Err)
	}
	v.state = g.State
	topics := map[string]bool{}
	for _, t := range extraTopics {
		topics[t] = true
	}
	for _, m := range g.Members {
		mem := &Member{MemberID: m.MemberID, ClientID: m.ClientID, Host: strings.TrimPrefix(m.ClientHost, "/")}
		if m.InstanceID != nil {
			mem.InstanceID = *m.InstanceID
		}
		v.members = append(v.members, *mem)
		if a, ok := m.Assigned.AsConsumer(); ok {
			for _, t := range a.Topics {
				topics[t.Topic] = true
				for _, p := range t.Partitions {
					v.owner[fence.Key{Group: c.cfg.Group, Topic: t.Topic, Partition: p}] = mem
				}
			}
		}
	}
	offs, err := c.adm.FetchOffsets(ctx, c.cfg.Group)
	if errors.Is(err, kerr.GroupIDNotFound) {
		offs, err = nil, nil // a group that never committed (kfake says so; Kafka answers with no offsets)
	}
	if err != nil {
		return nil, errorf(ErrUnreachable, "Kafka at %s: fetching the committed offsets of group %q: %v", c.brokers(), c.cfg.Group, err)
	}
	offs.Each(func(o kadm.OffsetResponse) {
		if o.Err == nil {
			topics[o.Topic] = true
			v.committed[fence.Key{Group: c.cfg.Group, Topic: o.Topic, Partition: o.Partition}] = o.At
		}
	})
	if len(c.cfg.Topics) > 0 {
		topics = map[string]bool{}
		for _, t := range c.cfg.Topics {
			topics[t] = true
		}
	}
	if len(topics) == 0 {
		return v, nil
	}
	names := make([]string, 0, len(topics))
	for t := range topics {
		names = append(names, t)
	}
	slices.Sort(names)
	ends, err := c.endOffsets(ctx, names)
	if err != nil {
		return nil, err
	}
	for p, o := range ends {
		v.topics[p.topic] = true
		v.hwm[fence.Key{Group: c.cfg.Group, Topic: p.topic, Partition: p.partition}] = o
	}
	starts, err := c.adm.ListStartOffsets(ctx, names...)
	if err != nil {
		return nil, errorf(ErrUnreachable, "Kafka at %s: listing the start offsets of %s: %v", c.brokers(), strings.Join(names, ","), err)
	}
	starts.Each(func(o kadm.ListedOffset) {
		if o.Err == nil {
			v.start[fence.Key{Group: c.cfg.Group, Topic: o.Topic, Partition: o.Partition}] = o.Offset
		}
	})
	return v, nil
}

// TopicPartitions returns the number of partitions of topic, failing with [ErrNotFound] if the
// brokers do not know it.
func (c *Collector) TopicPartitions(ctx context.Context, topic string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	if err := c.kcl.Ping(ctx); err != nil {
		return 0, errorf(ErrUnreachable, "Kafka at %s did not answer within %s: %v", c.brokers(), c.cfg.Timeout, err)
	}
	td, err := c.adm.ListTopics(ctx, topic)
	if err != nil {
		return 0, errorf(ErrUnreachable, "Kafka at %s: describing topic %q: %v", c.brokers(), topic, err)
	}
	t, ok := td[topic]
	if !ok || t.Err != nil || len(t.Partitions) == 0 {
		return 0, errorf(ErrNotFound, "topic %q does not exist on the brokers at %s", topic, c.brokers())
	}
	return len(t.Partitions), nil
}

// Collect reads the group's state from both sources. When a source cannot be reached it still
// returns the snapshot of what the other one holds (its Sources say which failed) together with
// an error wrapping [ErrUnreachable]. A group neither source knows fails with [ErrNotFound].
func (c *Collector) Collect(ctx context.Context) (*Snapshot, error) {
	start := time.Now()
	snap := &Snapshot{Group: c.cfg.Group, At: start.UTC()}
	var errs []error

	// The stores first: their fence rows name topics the group may have left.
	reads, storeSrcs, pl, serrs := c.readShards(ctx)
	errs = append(errs, serrs...)
	var fenceTopics []string
	nfences := 0
	for _, rd := range reads {
		nfences += len(rd.fences)
		for _, f := range rd.fences {
			if !slices.Contains(fenceTopics, f.Topic) {
				fenceTopics = append(fenceTopics, f.Topic)
			}
		}
	}

	kafkaSrc := Source{Name: "kafka", Addr: c.brokers()}
	kv, err := c.readKafka(ctx, fenceTopics)
	if err != nil {
		kafkaSrc.Err = err.Error()
		errs = append(errs, err)
		kv = nil
	}
	snap.Sources = append([]Source{kafkaSrc}, storeSrcs...)
	if c.Sharded() {
		for _, sh := range c.cfg.Shards {
			snap.Shards = append(snap.Shards, sh.Name)
		}
		if pl.p != nil {
			snap.Placement = pl.p.Version
		}
	}

	want := func(topic string) bool { return len(c.cfg.Topics) == 0 || slices.Contains(c.cfg.Topics, topic) }
	rows := map[fence.Key]*Partition{}
	row := func(k fence.Key) *Partition {
		if p, ok := rows[k]; ok {
			return p
		}
		p := &Partition{Topic: k.Topic, Partition: k.Partition}
		if c.Sharded() {
			p.Shard, _ = pl.shard(k)
		}
		rows[k] = p
		return p
	}
	key := func(topic string, p int32) fence.Key {
		return fence.Key{Group: c.cfg.Group, Topic: topic, Partition: p}
	}
	// placed reports whether shard name is where k's line comes from.
	placed := func(k fence.Key, name string) bool {
		s, ok := pl.shard(k)
		return !ok || s == name
	}
	var recs []Recovery
	for _, rd := range reads {
		for _, f := range rd.fences {
			if !want(f.Topic) {
				continue
			}
			k := key(f.Topic, f.Partition)
			p := row(k)
			if !placed(k, rd.name) {
				p.Elsewhere = append(p.Elsewhere, ShardFence{Shard: rd.name, Token: f.Token.String(), Position: f.Position, Claimant: f.Claimant, Retired: f.Retired()})
				continue
			}
			if _, ok := pl.shard(k); !ok {
				// No placement and only retired rows: the first found stands for the key.
				pl.at[k] = rd.name
				p.Shard = rd.name
			}
			p.Token = f.Token.String()
			p.Position = ptr(f.Position)
			p.Retired = f.Retired()
		}
		for k, n := range rd.backlogs {
			if want(k.Topic) && placed(k, rd.name) {
				row(k).Backlog = ptr(n)
			}
		}
		for _, r := range rd.recs {
			if want(r.Key.Topic) {
				recs = append(recs, Recovery{Topic: r.Key.Topic, Partition: r.Key.Partition, From: r.From.String(), To: r.To.String(), Reason: r.Reason, At: r.At,
					Shard: rd.name, Kind: RecoveryKind(r.Reason, r.From, r.To)})
			}
		}
	}
	if kv != nil {
		snap.GroupState = kv.state
		snap.Members = kv.members
		for k, h := range kv.hwm {
			row(k).HighWatermark = ptr(h)
		}
		for k, o := range kv.start {
			row(k).LogStart = ptr(o)
		}
		for k, o := range kv.committed {
			if want(k.Topic) {
				row(k).Committed = ptr(o)
			}
		}
		for k, m := range kv.owner {
			if want(k.Topic) {
				row(k).Owner = m
			}
		}
		for _, t := range c.cfg.Topics {
			if !kv.topics[t] {
				errs = append(errs, errorf(ErrNotFound, "topic %q does not exist on the brokers at %s", t, c.brokers()))
			}
		}
	}
	// Oldest first across the shards (each shard's are read oldest first).
	slices.SortStableFunc(recs, func(a, b Recovery) int { return a.At.Compare(b.At) })
	for _, v := range recs {
		k := key(v.Topic, v.Partition)
		snap.Recoveries = append(snap.Recoveries, v)
		if placed(k, v.Shard) {
			row(k).LastRecovery = &v
		}
		snap.Summary.Recoveries++
		switch v.Kind {
		case KindRegression:
			snap.Summary.Regressions++
		case KindHandover:
			snap.Summary.Handovers++
		}
	}
	for _, p := range rows {
		switch {
		case p.HighWatermark != nil && p.Position != nil:
			p.Lag = ptr(max(0, *p.HighWatermark-(*p.Position+1)))
		case p.HighWatermark != nil && p.Committed != nil:
			p.Lag = ptr(max(0, *p.HighWatermark-*p.Committed))
		case p.HighWatermark != nil && kv != nil:
			p.Lag = ptr(*p.HighWatermark) // nothing applied or committed: everything is behind
		}
		if p.Lag != nil {
			snap.Summary.TotalLag += *p.Lag
		}
		if p.LogStart != nil && p.Position != nil && *p.Position != fence.NoPosition && *p.LogStart > *p.Position+1 {
			p.Lost = ptr(*p.LogStart - (*p.Position + 1))
		}
		if p.Backlog != nil {
			snap.Summary.Backlog += *p.Backlog
		}
		if p.Owner != nil {
			snap.Summary.Owned++
		} else {
			snap.Summary.Unowned++
		}
		snap.Partitions = append(snap.Partitions, *p)
	}
	slices.SortFunc(snap.Partitions, func(a, b Partition) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return int(a.Partition - b.Partition)
	})
	snap.Summary.Members = len(snap.Members)

	// A group no reachable source knows is a wrong group, not an empty one.
	storeOK, kafkaOK := true, kafkaSrc.Err == ""
	var where []string
	for _, src := range storeSrcs {
		storeOK = storeOK && src.Err == ""
		where = append(where, src.Addr)
	}
	stores := strings.Join(where, ", ")
	groupUnknown := kv != nil && (kv.state == "Dead" || kv.state == "") && len(kv.committed) == 0
	switch {
	case storeOK && nfences == 0 && kafkaOK && groupUnknown:
		errs = append(errs, errorf(ErrNotFound, "group %q: the brokers at %s know no such group and %s has no fence rows for it", c.cfg.Group, c.brokers(), stores))
	case storeOK && nfences == 0:
		errs = append(errs, errorf(ErrNotFound, "%s has no fence rows for group %q (is -store the database the group's members write to, and -fence-table its table?)", stores, c.cfg.Group))
	}
	snap.Took = time.Since(start)
	return snap, errors.Join(errs...)
}

func ptr[T any](v T) *T { return &v }

// shardRead is what one shard's store holds for the group.
type shardRead struct {
	name     string
	fences   []Fence
	recs     []fence.Recovery
	backlogs map[fence.Key]int64
}

// readShards reads every shard's fences, recoveries and outbox backlogs, and the placement
// from the home shard. A shard that cannot be read is named in its source and its error
// returned; the others are still read.
func (c *Collector) readShards(ctx context.Context) ([]shardRead, []Source, placer, []error) {
	var errs []error
	ss := c.Shards(ctx)
	reads := make([]shardRead, 0, len(ss))
	srcs := make([]Source, len(ss))
	for i, sh := range ss {
		srcs[i] = Source{Name: sh.sourceName(), Addr: sh.Addr}
		err := sh.Err
		if err == nil {
			rd := shardRead{name: sh.Name}
			sctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
			rd.fences, err = sh.Store.Fences(sctx, c.cfg.Group)
			if err == nil {
				rd.recs, err = sh.Store.Recoveries(sctx, c.cfg.Group)
			}
			if err == nil {
				rd.backlogs, err = sh.Store.Backlogs(sctx, c.cfg.Group)
			}
			cancel()
			if err != nil && !errors.Is(err, ErrNotFound) {
				// A failed read may be a dropped connection: reopen next time.
				c.DropShard(i)
				err = errorf(ErrUnreachable, "%v", err)
			}
			err = shardErr(sh.Name, err)
			reads = append(reads, rd)
		}
		if err != nil {
			srcs[i].Err = err.Error()
			errs = append(errs, err)
		}
	}
	pl := placer{at: map[fence.Key]string{}}
	sctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	p, err := c.Placement(sctx, c.stores[0]) // nil when the home shard could not be read
	cancel()
	switch {
	case err == nil:
		pl.p = &p
	case c.stores[0] != nil:
		// The home shard answered but its placement could not be used.
		if srcs[0].Err == "" {
			srcs[0].Err = err.Error()
		}
		errs = append(errs, err)
	}
	if pl.p == nil {
		for _, rd := range reads {
			for _, f := range rd.fences {
				if !f.Retired() {
					pl.at[fence.Key{Group: c.cfg.Group, Topic: f.Topic, Partition: f.Partition}] = rd.name
				}
			}
		}
	}
	return reads, srcs, pl, errs
}

// automaticPrefix starts the reason the consumer records when it recovers a verified
// regression itself (consumer/worker.go).
const automaticPrefix = "consumer group "

// IsAutomatic reports whether a recovery's reason is the consumer's own (a verified
// regression), not an operator's.
func IsAutomatic(reason string) bool { return strings.HasPrefix(reason, automaticPrefix) }
