package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/batonhq/baton/cmd/baton/internal/bench"
	"github.com/batonhq/baton/internal/operator/chaos"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run runs the command line args and returns the exit status: 0 on success and after help was
// asked for, 2 for a command line that cannot run (with the usage), 1 when the command failed.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The demo's live view writes beside the harness's progress.
	stdout, stderr = &lockedWriter{w: stdout}, &lockedWriter{w: stderr}
	var err error
	switch args[0] {
	case "help", "-h", "-help", "--help":
	default:
		err = checkRenamedEnv()
	}
	if err != nil {
		fmt.Fprintf(stderr, "baton %s: %v\n", args[0], err)
		return 2
	}
	switch args[0] {
	case "demo":
		err = demo(ctx, args[1:], stdout, stderr)
	case "chaos":
		err = chaosCmd(ctx, args[1:], stdout, stderr)
	case "status":
		err = statusCmd(ctx, args[1:], stdout, stderr)
	case "audit":
		err = auditCmd(ctx, args[1:], stdout, stderr)
	case "who-owns":
		err = whoOwnsCmd(ctx, args[1:], stdout, stderr)
	case "eras":
		err = erasCmd(ctx, args[1:], stdout, stderr)
	case "recover":
		err = recoverCmd(ctx, args[1:], stdout, stderr)
	case "topics":
		err = topicsCmd(ctx, args[1:], stdout, stderr)
	case "schema":
		err = schemaCmd(ctx, args[1:], stdout, stderr)
	case "migrate":
		err = migrateCmd(ctx, args[1:], stdout, stderr)
	case "placement":
		err = placementCmd(ctx, args[1:], stdout, stderr)
	case chaos.WorkerCommand:
		err = chaos.RunWorker(ctx, args[1:])
	case "bench":
		err = benchCmd(ctx, args[1:], stdout, stderr)
	case bench.WorkerCommand:
		err = benchWorker(ctx, args[1:], stdout)
	case handoverWorkerCommand:
		err = handoverWorker(ctx, args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		usage(stdout)
		return 0
	default:
		fmt.Fprintf(stderr, "baton: unknown command %q\n", args[0])
		usage(stderr)
		return 2
	}
	var ue usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		if !ue.printed {
			fmt.Fprintf(stderr, "baton %s: %v\nRun 'baton %s -h' for its flags.\n", args[0], ue.err, args[0])
		}
		return 2
	case errors.Is(err, chaos.ErrUsage):
		fmt.Fprintf(stderr, "baton %s: %v\n", args[0], err)
		return 2
	}
	fmt.Fprintf(stderr, "baton %s: %v\n", args[0], err)
	return 1
}

// lockedWriter serialises writes from several goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// usageError is a command line a command cannot run: baton exits 2.
type usageError struct {
	err     error
	printed bool // the flag package already printed it, with the flags
}

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// newFlagSet returns a command's flag set: errors and help go to stderr, and help starts with
// the command's synopsis and description.
func newFlagSet(name, synopsis, about string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: baton %s %s\n\n%s\nflags:\n", name, synopsis, about)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args into fs. It returns flag.ErrHelp for -h (the flags printed), and a
// usageError for an unknown flag, a bad value or a stray argument.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err: err, printed: true}
	}
	if fs.NArg() > 0 {
		err := fmt.Errorf("unexpected arguments %q", fs.Args())
		fmt.Fprintln(fs.Output(), err)
		fs.Usage()
		return usageError{err: err, printed: true}
	}
	return nil
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: baton <command> [flags]

commands:
  demo     the digital-twin demo: a zombie owner's writes refused (embedded: nothing to install)
  chaos    a chaos run against a real Kafka and PostgreSQL, with a verdict and an HTML report
  worker   one chaos worker process (started by 'baton chaos' and 'baton demo')
  bench    Baton against the alternatives (watermill, a Redis lock, one row per transaction,
           the database's ceiling), side by side against a real Kafka and PostgreSQL;
           'bench handover' times graceful and crash handovers between member processes

operating a group:
  status   per partition: owner, token, position, committed offset, lag, outbox backlog;
           -http ADDR serves it as a live page (with /metrics)
  audit    the group's safety invariants judged online (skipped records, tokens, outbox,
           delivery, inbox, liveness); -once for one pass, -http ADDR for the page and /metrics
  who-owns the partition a key routes to, its owner, token and lag
  eras     the recorded recoveries (era advances) of a group
  recover  an operator's recorded era advance (a reason is required)
  topics   each topic's stored identity against the brokers' (recreated? grown?);
           'topics reset' accepts a recreated topic, 'topics ack' acknowledges growth
  schema   print the DDL of Baton's tables (PostgreSQL or SQLite)
  migrate  create Baton's tables in a store
  placement a sharded sink's placement ($BATON_POSTGRES_SHARD_URLS): 'placement show',
           'placement move -key GROUP/TOPIC/PARTITION -to SHARD'

A sharded sink's databases ($BATON_POSTGRES_SHARD_URLS or -shards: NAME=URL, home first) are
read by status, audit, who-owns, eras, schema and migrate, each of them; recover and topics
work on one database (-store).

'baton <command> -h' lists a command's flags.
`)
}
