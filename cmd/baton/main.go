package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/batonhq/baton/internal/chaos"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 {
		usage()
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch args[0] {
	case "demo":
		err = demo(ctx, args[1:])
	case "chaos":
		err = chaosCmd(ctx, args[1:])
	case chaos.WorkerCommand:
		err = chaos.RunWorker(ctx, args[1:])
	case "help", "-h", "--help":
		usage()
		return 0
	default:
		fmt.Fprintf(os.Stderr, "baton: unknown command %q\n", args[0])
		usage()
		return 2
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "baton %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

func usage() {
	fmt.Fprint(os.Stderr, `usage: baton <command> [flags]

commands:
  demo     the digital-twin demo: a zombie owner's writes refused (embedded: nothing to install)
  chaos    a chaos run against a real Kafka and PostgreSQL, with a verdict and a timeline
  worker   one chaos worker process (started by 'baton chaos')

'baton <command> -h' lists a command's flags.
`)
}
