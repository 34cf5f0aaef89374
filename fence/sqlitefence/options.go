package sqlitefence

import (
	"errors"
	"fmt"
	"time"

	"github.com/batonhq/baton/fence"
)

// DefaultTable is the table name used when no [Table] option is given: the same as
// pgfence.DefaultTable, so that a deployment's tables are named alike in either store.
const DefaultTable = "baton_fences"

// DefaultBusyTimeout is the busy timeout used when no [BusyTimeout] option is given.
const DefaultBusyTimeout = 5 * time.Second

// Synchronous is SQLite's PRAGMA synchronous setting, chosen with [Sync] for [Open]. In WAL mode:
//
//   - SyncFull (the default): every commit fsyncs the write-ahead log before it returns. A
//     commit that returned survives a process crash and a power loss or OS crash.
//   - SyncNormal: commits are written to the WAL but fsynced only at checkpoints. A commit that
//     returned survives a process crash (the data is in the OS page cache), but the last
//     commits may be rolled back by a power loss or OS crash. The database is never corrupted
//     and the fence never goes backwards relative to the data it guards (both live in the same
//     transactions), but a position already reported to Kafka as committed may be lost: the
//     records after it are then re-applied from Kafka, which is safe only because the fence
//     position was lost with them.
type Synchronous int

const (
	SyncFull   Synchronous = 2
	SyncNormal Synchronous = 1
)

func (s Synchronous) String() string {
	switch s {
	case SyncFull:
		return "FULL"
	case SyncNormal:
		return "NORMAL"
	}
	return fmt.Sprintf("Synchronous(%d)", int(s))
}

type config struct {
	table       string
	busyTimeout time.Duration
	sync        Synchronous
	syncSet     bool
}

// Option configures [Open] and [New].
type Option func(*config) error

// Table sets the name of the fence table (default [DefaultTable]). The store also creates
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
// [DefaultBusyTimeout]). [Open] sets it as the connections' busy_timeout; the store's own
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

// Sync sets PRAGMA synchronous for [Open] (default [SyncFull]); see [Synchronous] for what each
// setting guarantees. [New] rejects it with [fence.ErrInvalid]: the caller owns that database's
// settings.
func Sync(s Synchronous) Option {
	return func(c *config) error {
		if s != SyncFull && s != SyncNormal {
			return fmt.Errorf("%w: synchronous %s; use SyncFull or SyncNormal", fence.ErrInvalid, s)
		}
		c.sync, c.syncSet = s, true
		return nil
	}
}

func newConfig(opts []Option) (config, error) {
	c := config{table: DefaultTable, busyTimeout: DefaultBusyTimeout, sync: SyncFull}
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
