package chaos

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	engine "github.com/batonhq/baton/internal/operator/chaos"
	"github.com/batonhq/baton/outbox"
)

// Workload is an application run under chaos. The harness creates its topics, runs its
// consumers in every worker process under the faults, lets it produce its input, and after the
// run judges its invariants next to the harness's own (no stale commit, no re-applied offsets,
// no write of a frozen worker after its takeover).
//
// The same Workload value is given to [Main] (or [Run]) in the harness's process and in every
// worker process, which is the same program re-executed: the harness's process calls Migrate,
// Produce, Settled and Check; a worker calls Consumers.
type Workload interface {
	// Topics lists the topics a run creates, as suffixes of the run's topic name (see
	// [Env.Topic]); "" is the run's topic itself.
	Topics() []string
	// Migrate creates the workload's tables (idempotently) in the run's database.
	Migrate(ctx context.Context, env Env) error
	// Consumers returns the consumers a worker process runs and a function that releases what
	// they hold (called after they stopped; nil for none).
	Consumers(ctx context.Context, env Env) ([]Consumer, func(), error)
	// Produce writes the input with cl, at about rate records per second, until stop is closed
	// (finishing whatever it must so the input is whole).
	Produce(ctx context.Context, env Env, cl *kgo.Client, rate int, stop <-chan struct{}) error
	// Settled reports whether everything produced has been processed to its end.
	Settled(ctx context.Context, env Env) (bool, error)
	// Check reads the databases after the run and judges the workload's invariants.
	Check(ctx context.Context, env Env) ([]Invariant, error)
}

// Env is what a [Workload] is told about a run.
//
// Besides the workload's own tables, the run's database holds the harness's: chaos_applied
// (one row per committed batch: topic, part, era, epoch, worker, first_off, last_off, at_ms,
// and produced_ms, the Kafka timestamp of the batch's oldest record) and chaos_attempts (one
// row per write attempt, with its outcome and whether its writer was a frozen worker taken
// over: zombie).
type Env struct {
	Fenced      bool   // the consumers run under Baton's fence (false: -unfenced, Kafka's assignment alone)
	DB          DB     // the run's database, for statements outside a handler and for checks
	PostgresURL string // exactly one of PostgresURL and SQLitePath locates it
	SQLitePath  string
	Worker      string // the worker process's id; "" in the harness's process

	base string
}

// Topic returns the run's name for a topic suffix ("" is the run's topic).
func (e Env) Topic(suffix string) string {
	if suffix == "" {
		return e.base
	}
	return e.base + "-" + suffix
}

// Consumer is one consumer group of a [Workload]: every worker process runs one member of it.
type Consumer struct {
	Name   string   // the group's suffix of the run's group name ("" for the run's group)
	Topics []string // topic suffixes it consumes
	// Inbox admits each record through Baton's inbox before the handler sees it (fenced runs):
	// for records another consumer sent through its outbox, whose copies are dropped.
	Inbox bool
	// Handler returns the handler of one partition for one owner (its token); a worker calls
	// it when it is assigned the partition.
	Handler func(ctx context.Context, k fence.Key, t fence.Token) (Handler, error)
}

// Handler applies a batch of one partition inside tx. It is never called concurrently for
// the same partition. Return [Batch.Fail]'s error for a poison record, [NotDue]'s to have the
// batch retried later, any other error to have it retried with backoff.
type Handler func(ctx context.Context, tx Tx, b *Batch) error

// Batch is a batch of records of one partition, as a [Handler] sees it.
type Batch struct {
	Key     fence.Key   // group, topic and partition
	Token   fence.Token // the owner's token
	Records []*kgo.Record
	Worker  string // the worker process's id

	b *engine.AppBatch
}

// Append sends msgs with the batch's transaction: through Baton's outbox in a fenced run
// (the append is fenced too), produced after the commit in an unfenced one.
func (b *Batch) Append(ctx context.Context, msgs ...outbox.Message) error {
	return b.b.Append(ctx, msgs...)
}

// Fail returns the error that marks r as a poison record (dead-lettered in a fenced run,
// skipped in an unfenced one).
func (b *Batch) Fail(r *kgo.Record, err error) error { return b.b.Fail(r, err) }

// IdempotencyKey returns the idempotency key r carries from the outbox that sent it ("" for a
// record without Baton's headers, as in an unfenced run).
func (b *Batch) IdempotencyKey(r *kgo.Record) string { return b.b.IdempotencyKey(r) }

// NotDue returns the error of a handler whose batch holds a record that must not be applied
// before due (a timeout record before its deadline): the batch is rolled back and retried at
// due, never reordered.
func NotDue(due time.Time, err error) error { return engine.NotDue(due, err) }

// Invariant is one invariant as the checker judged it.
type Invariant struct {
	Name       string // what must hold, in words
	Checked    int64  // how many things were checked
	Violations int64  // how many broke it
	Example    string // one violation, for the report ("" if none)
}

// String renders the invariant as a verdict line.
func (i Invariant) String() string {
	s := fmt.Sprintf("%s: %d checked, %d violations", i.Name, i.Checked, i.Violations)
	if i.Example != "" {
		s += " (e.g. " + i.Example + ")"
	}
	return s
}

// Tx is a handler's transaction. Statements use PostgreSQL's $N placeholders on both
// databases (rewritten for SQLite), so one workload runs on PostgreSQL and on SQLite.
type Tx interface {
	Exec(ctx context.Context, sql string, args ...any) error
	QueryRow(ctx context.Context, sql string, args ...any) Row
}

// DB is a database outside any handler's transaction, with the same placeholders as [Tx].
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) error
	Query(ctx context.Context, sql string, args ...any) (Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) Row
}

// Row is a single-row query result.
type Row interface{ Scan(dest ...any) error }

// Rows iterates a query's result.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// SQLDB adapts a database/sql handle on SQLite (a database of the workload's own, such as an
// external service's next to the run's).
func SQLDB(db *sql.DB) DB { return wrapDB(engine.SQLDB(db)) }
