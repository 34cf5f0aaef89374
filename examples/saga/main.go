package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/batonhq/baton/consumer/chaos"
)

func main() {
	s := &Saga{}
	flag.DurationVar(&s.StepTimeout, "step-timeout", 4*time.Second, "how long a step may go unanswered before its timeout record fires")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, s, os.Args[1:], os.Stdout)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case err != nil:
		fmt.Fprintln(os.Stderr, "saga:", err)
		os.Exit(1)
	}
}

// run runs the saga under the chaos harness (or, when the harness re-executes this program as
// a worker process, the worker) and prints its verdict and the walk-through of one order. It
// fails if an invariant broke.
func run(ctx context.Context, s *Saga, args []string, out io.Writer) error {
	res, err := chaos.Run(ctx, s, args, out)
	if err != nil || res == nil { // res is nil in a worker process
		return err
	}
	fmt.Fprintln(out)
	fmt.Fprint(out, s.Story())
	if !res.Pass {
		return errors.New("invariants violated")
	}
	return nil
}
