package sqlitefence

import (
	"errors"
	"fmt"
	"time"

	"github.com/batonhq/baton/fence"
)

// The defaults: the table's name is the same as pgfence's, so that a deployment's tables are
// named alike in either store.
const (
	defaultTable       = "baton_fences"
	defaultBusyTimeout = 5 * time.Second
)

type config struct {
	table       string
	busyTimeout time.Duration
	sync        string // PRAGMA synchronous: "FULL" or "NORMAL"
	syncSet     bool
}

// Option configures [Open] and [New].
type Option func(*config) error

// Table sets the name of the fence table (default "baton_fences"). The store also creates
// name+"_recoveries" (the Recover audit trail), name+"_recoveries_idx" (its index) and name+"_keyed"
// (keyed fences). The name is "table" or "schema.table" (schema being an attached database,
// such as "main"), each part matching [A-Za-z_][A-Za-z0-9_]* and, with the suffixes, at most
// 63 bytes; anything else fails with [fence.ErrInvalid].
func Table(name string) Option {
	return func(c *config) error {
		if err := validateTable(name); err != nil {
			return err
		}
		c.table = name
		return nil
	}
}

// BusyTimeout bounds how long one store operation waits for SQLite's write lock (default
// 5s). [Open] sets it as the connections' busy_timeout; the store's own
// transactions additionally retry SQLITE_BUSY until it has elapsed since the call began, then
// fail with [ErrBusy]. Zero means do not wait: fail at once with ErrBusy.
func BusyTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("%w: busy timeout %s is negative", fence.ErrInvalid, d)
		}
		c.busyTimeout = d
		return nil
	}
}

// SyncNormal makes [Open] set PRAGMA synchronous=NORMAL instead of FULL, the default. In WAL
// mode, with FULL every commit fsyncs the write-ahead log before it returns: a commit that
// returned survives a process crash and a power loss or OS crash. With NORMAL commits are
// written to the WAL but fsynced only at checkpoints: a commit that returned survives a process
// crash (the data is in the OS page cache), but the last commits may be rolled back by a power
// loss or OS crash. The database is never corrupted and the fence never goes backwards relative
// to the data it guards (both live in the same transactions), but a position already reported
// to Kafka as committed may be lost: the records after it are then re-applied from Kafka, which
// is safe only because the fence position was lost with them. [New] rejects it with
// [fence.ErrInvalid]: the caller owns that database's settings.
func SyncNormal() Option {
	return func(c *config) error {
		c.sync, c.syncSet = "NORMAL", true
		return nil
	}
}

func newConfig(opts []Option) (config, error) {
	c := config{table: defaultTable, busyTimeout: defaultBusyTimeout, sync: "FULL"}
	var errs []error
	for i, o := range opts {
		if o == nil {
			errs = append(errs, fmt.Errorf("%w: sqlitefence: option %d is nil", fence.ErrInvalid, i))
			continue
		}
		if err := o(&c); err != nil {
			errs = append(errs, err)
		}
	}
	return c, errors.Join(errs...)
}
