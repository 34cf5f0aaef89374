package chaos

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/consumer"
	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/outbox"
)

// App is an application run under chaos: the harness creates its topics, runs its consumers in
// every worker process under the faults, lets it produce its input, and after the run judges
// its own invariants over the databases next to the harness's (no stale commit, no re-applied
// offsets, the faults bit). Its runs get the same verdict table and timeline as the built-in
// workload's. The same App value must be given to [Run] (through [Config.App]) and, in the
// worker binary, to [RunWorker], which picks it by [App.Name].
//
// Handlers see transactions through [Tx] (PostgreSQL's $N placeholders on both databases), so
// one App runs on PostgreSQL and on SQLite. In [Fenced] mode each consumer is a Baton consumer
// with a fenced sink, its messages go through the fenced outbox and, with [AppConsumer.Inbox],
// its records through the inbox; in [Unfenced] mode the same handlers run on Kafka's assignment
// alone: a plain transaction, messages produced after the commit, no inbox.
type App interface {
	// Name names the application on worker command lines.
	Name() string
	// Topics lists the topics a run creates, as suffixes of the run's topic name (see
	// [AppEnv.Topic]); "" is the run's topic itself.
	Topics() []string
	// Migrate creates the application's tables (idempotently) in the run's database.
	Migrate(ctx context.Context, env AppEnv) error
	// Consumers returns the consumers a worker process runs, and a function that releases
	// what they hold (called after they stopped).
	Consumers(ctx context.Context, env AppEnv) ([]AppConsumer, func(), error)
	// Produce writes the application's input with cl, at about rate records per second, until
	// stop is closed (finishing whatever it must so the input is whole). The harness's process
	// calls it once per run, on the App value the run was given.
	Produce(ctx context.Context, env AppEnv, cl *kgo.Client, rate int, stop <-chan struct{}) error
	// Settled reports whether everything produced has been processed to its end (with the
	// harness's own condition that every consumed topic is applied to its end offset).
	Settled(ctx context.Context, env AppEnv) (bool, error)
	// Check reads the databases after a run and judges the application's invariants.
	Check(ctx context.Context, env AppEnv) ([]Invariant, error)
}

// AppEnv is what an [App] is told about a run: the mode, the database (for statements outside
// a handler's transaction and for checks), the database's location (to open more of its own)
// and the run's topic names.
type AppEnv struct {
	Mode        Mode
	DB          DB
	PostgresURL string // exactly one of PostgresURL and SQLitePath
	SQLitePath  string
	Worker      string // the worker's id; "" in the harness's process
	base        string
}

// Topic returns the run's name for an application topic suffix ("" is the run's topic).
func (e AppEnv) Topic(suffix string) string { return topicName(e.base, suffix) }

func topicName(base, suffix string) string {
	if suffix == "" {
		return base
	}
	return base + "-" + suffix
}

// AppConsumer is one consumer group of an [App]: every worker process runs one member of it.
type AppConsumer struct {
	Name   string   // the group's suffix of the run's group name ("" for the run's group)
	Topics []string // topic suffixes it consumes
	// Inbox admits each record through the inbox (fenced mode) before Handle sees it: records
	// relayed by another consumer's outbox, whose copies and zombie records are dropped.
	Inbox bool
	// Factory returns the handler of one partition for one owner (token), like
	// [consumer.Factory]: a worker calls it when it is assigned the partition.
	Factory func(ctx context.Context, k fence.Key, t fence.Token) (AppHandler, error)
}

// AppHandler applies a batch inside its transaction. Return [consumer.Permanent] (through
// [AppBatch.Fail]) for a poison record, an error wrapping [ErrNotDue] to have the batch
// retried later, any other error to have it retried with backoff.
type AppHandler func(ctx context.Context, tx Tx, b *AppBatch) error

// AppBatch is a batch of one partition, as an [AppConsumer.Handle] sees it.
type AppBatch struct {
	Key     fence.Key // Group, Topic and Partition
	Token   fence.Token
	Records []*kgo.Record
	Worker  string

	fenced  bool
	batch   *consumer.Batch
	appendf func(ctx context.Context, msgs ...outbox.Message) error
}

// Append sends msgs with the batch's transaction: through the fenced outbox (fenced mode,
// where the append checks the fence too), or produced after the commit (unfenced mode).
func (b *AppBatch) Append(ctx context.Context, msgs ...outbox.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	return b.appendf(ctx, msgs...)
}

// Fail marks r as a poison record (dead-lettered in fenced mode, skipped unfenced).
func (b *AppBatch) Fail(r *kgo.Record, err error) error {
	if b.batch != nil {
		return b.batch.Fail(r, err)
	}
	return consumer.Permanent(err)
}

// IdempotencyKey returns the idempotency key r carries from the outbox that sent it ("" for a
// record without Baton's headers, as in unfenced mode).
func (b *AppBatch) IdempotencyKey(r *kgo.Record) string {
	e, err := outbox.ParseEnvelope(r)
	if err != nil {
		return ""
	}
	if e.IdempotencyKey != "" {
		return e.IdempotencyKey
	}
	return e.Source.String() + "/" + strconv.FormatInt(e.Seq, 10) // the derived key (outbox.Message)
}

// Fenced reports whether the batch runs under Baton's fence.
func (b *AppBatch) Fenced() bool { return b.fenced }

// ErrNotDue is returned (wrapped, best through [NotDue]) by a handler whose batch holds a
// record that must not be applied yet, such as a timeout record before its deadline: the batch
// is rolled back and retried, never reordered, and the attempt is not logged as an error.
var ErrNotDue = errors.New("chaos: not due yet")

// NotDueError says when a batch that was not due will be: the worker waits until then, outside
// any transaction, before it retries the batch.
type NotDueError struct {
	Due time.Time
	Err error // what was not due, for logs
}

func (e *NotDueError) Error() string {
	return fmt.Sprintf("%v: not due until %s", e.Err, e.Due.Format(time.RFC3339Nano))
}
func (e *NotDueError) Unwrap() []error { return []error{ErrNotDue, e.Err} }

// NotDue returns an error for a batch not due until due.
func NotDue(due time.Time, err error) error { return &NotDueError{Due: due, Err: err} }

// dueTable remembers, per partition, when a batch that was not due becomes due.
type dueTable struct {
	mu  sync.Mutex
	due map[fence.Key]time.Time
}

func (d *dueTable) note(k fence.Key, err error) {
	var nd *NotDueError
	if errors.As(err, &nd) {
		d.mu.Lock()
		if d.due == nil {
			d.due = map[fence.Key]time.Time{}
		}
		d.due[k] = nd.Due
		d.mu.Unlock()
	}
}

// wait sleeps until k's batch is due (or ctx ends); it returns at once if none waits.
func (d *dueTable) wait(ctx context.Context, k fence.Key) {
	d.mu.Lock()
	due, ok := d.due[k]
	delete(d.due, k)
	d.mu.Unlock()
	if ok {
		sleep(ctx, time.Until(due))
	}
}

// Invariant is one application invariant as the checker judged it.
type Invariant struct {
	Name       string // what must hold, in words
	Checked    int64  // how many things were checked (orders, rows...)
	Violations int64  // how many broke it
	Example    string // one violation, for the report ("" if none)
}

// Sort orders invariants by name, for stable reports.
func sortInvariants(is []Invariant) {
	sort.SliceStable(is, func(i, j int) bool { return is[i].Name < is[j].Name })
}

// String renders the invariant as a verdict line.
func (i Invariant) String() string {
	s := fmt.Sprintf("%s: %d checked, %d violations", i.Name, i.Checked, i.Violations)
	if i.Example != "" {
		s += " (e.g. " + i.Example + ")"
	}
	return s
}

// appByName picks the app a worker runs.
func appByName(name string, apps []App) (App, error) {
	for _, a := range apps {
		if a != nil && a.Name() == name {
			return a, nil
		}
	}
	return nil, fmt.Errorf("%w: no application %q in this binary", ErrUsage, name)
}
