package leasetest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/lease"
)

// Environment of a helper process.
const (
	envChild    = "BATON_LEASETEST_CHILD"     // "1" in a helper
	envSQLite   = "BATON_LEASETEST_SQLITE"    // the SQLite file, when the sink is SQLite
	envPGSchema = "BATON_LEASETEST_PG_SCHEMA" // the schema, when the sink is PostgreSQL
)

// envOpTimeout overrides opTimeout (a Go duration), for the suite's own mutant tests.
const envOpTimeout = "BATON_LEASETEST_OP_TIMEOUT"

// opTimeout bounds every command a helper runs, acquire included: 15s, far above the 2-3s a
// successor waits for a frozen holder's lease to expire in the tests.
var opTimeout = func() time.Duration {
	if d, err := time.ParseDuration(os.Getenv(envOpTimeout)); err == nil && d > 0 {
		return d
	}
	return 15 * time.Second
}()

// Config describes the source under test, for the helper processes.
type Config struct {
	// NewSource opens the source in a helper process (and in the parent, for Kill). close
	// releases what it opened.
	NewSource func(ctx context.Context) (src lease.Source, close func(), err error)
}

// IsChild reports whether this process is a helper started by the suite.
func IsChild() bool { return os.Getenv(envChild) == "1" }

// Child runs the helper process's command loop on stdin/stdout and returns its exit code. Call
// it from TestMain: if leasetest.IsChild() { os.Exit(leasetest.Child(cfg)) }.
func Child(cfg Config) int {
	if err := runChild(cfg, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "leasetest helper:", err)
		return 1
	}
	return 0
}

func runChild(cfg Config, in io.Reader, out io.Writer) error {
	ctx := context.Background()
	tg, err := openTarget(ctx, os.Getenv(envPGSchema), os.Getenv(envSQLite))
	if err != nil {
		return err
	}
	defer tg.close()
	src, closeSrc, err := cfg.NewSource(ctx)
	if err != nil {
		return fmt.Errorf("open source: %w", err)
	}
	defer closeSrc()
	var l *lease.Lease
	defer func() {
		if l != nil {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_ = l.Release(rctx)
			cancel()
		}
	}()
	reply := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if f[0] != "acquire" && l == nil {
			reply("err other no lease")
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, opTimeout)
		switch f[0] {
		case "acquire": // acquire RESOURCE -> ok TOKEN ID
			got, err := src.Acquire(cctx, f[1])
			if err != nil {
				reply("%s", describe(nil, err))
				break
			}
			l = got
			reply("ok %s %s", l.Token(), l.ID())
		case "claim": // claim -> ok POSITION
			st, err := tg.claim(cctx, l)
			if err != nil {
				reply("%s", describe(l, err))
				break
			}
			reply("ok %d", st.Position)
		case "write": // write POS VALUE: through lease.Apply
			pos, _ := strconv.ParseInt(f[1], 10, 64)
			reply("%s", describe(l, tg.apply(cctx, l, pos, f[2], nil)))
		case "raw": // raw POS VALUE: straight through the sink with the held token, no lease check
			pos, _ := strconv.ParseInt(f[1], 10, 64)
			reply("attempt %s %s", l.Key(), l.Token())
			reply("%s", describe(l, tg.raw(cctx, l.Key(), l.Token(), pos, f[2])))
		case "hold": // hold POS VALUE: lease.Apply whose fn writes, says "infn", then waits for its ctx
			pos, _ := strconv.ParseInt(f[1], 10, 64)
			err := tg.apply(cctx, l, pos, f[2], func(ctx context.Context) {
				reply("infn")
				select {
				case <-ctx.Done():
				case <-time.After(opTimeout):
				}
			})
			reply("%s", describe(l, err))
		case "waitlost": // waitlost -> ok CAUSE once the lease's context has ended
			select {
			case <-l.Context().Done():
				reply("ok %v", context.Cause(l.Context()))
			case <-cctx.Done():
				reply("err other lease still held after %s", opTimeout)
			}
		case "release":
			err := l.Release(cctx)
			l = nil
			reply("%s", describe(nil, err))
		default:
			reply("err other unknown command %q", f[0])
		}
		cancel()
	}
	return sc.Err()
}

// describe formats a command's outcome as one line: "ok", or
// "err stale stored=T presented=T lost=B :: message", or "err other lost=B :: message".
func describe(l *lease.Lease, err error) string {
	if err == nil {
		return "ok"
	}
	lost := l != nil && errors.Is(err, lease.ErrLost)
	msg := strings.ReplaceAll(err.Error(), "\n", " | ")
	var stale *fence.StaleError
	if errors.As(err, &stale) {
		return fmt.Sprintf("err stale stored=%s presented=%s lost=%t :: %s", stale.Stored, stale.Presented, lost, msg)
	}
	return fmt.Sprintf("err other lost=%t :: %s", lost, msg)
}
