package pglease

import (
	"fmt"
	"regexp"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/lease"
	"github.com/batonhq/baton/internal/fencecheck"
)

// Defaults of the options (each option's doc states its own).
const (
	defaultTTL   = 10 * time.Second
	defaultTable = "baton_lease_counters"
	defaultGroup = "lease:postgres"
)

type config struct {
	ttl   time.Duration
	table string
	group string
	era   int64
}

// Option configures a [Source].
type Option func(*config) error

// TTL sets how long a silent holder keeps the lock (default 10s): the lease's session runs
// with idle_session_timeout = TTL, so PostgreSQL terminates it, and frees its advisory lock,
// once the holder has sent nothing for that long (paused, cut off). The holder pings every
// TTL/3. Below one second fails with [fence.ErrInvalid].
func TTL(d time.Duration) Option {
	return func(c *config) error {
		if d < time.Second {
			return fmt.Errorf("%w: pglease: TTL %s is below one second", fence.ErrInvalid, d)
		}
		c.ttl = d
		return nil
	}
}

var tableName = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*\.)?[A-Za-z_][A-Za-z0-9_]*$`)

// Table sets the counter table, "name" or "schema.name" (default "baton_lease_counters",
// resolved through the connection's search_path), at most 63 bytes per part. It is quoted, so
// it is case-sensitive.
func Table(name string) Option {
	return func(c *config) error {
		if !tableName.MatchString(name) || len(name) > 127 {
			return fmt.Errorf("%w: pglease: table name %q", fence.ErrInvalid, name)
		}
		c.table = name
		return nil
	}
}

// Group sets the fence key group of the leases (default "lease:postgres"; see [lease.Key]).
// Give each database its own group if one sink fences resources of several.
func Group(name string) Option {
	return func(c *config) error {
		if err := fencecheck.ValidateKey(lease.Key(name, "x")); err != nil {
			return fmt.Errorf("pglease: group: %w", err)
		}
		c.group = name
		return nil
	}
}

// Era sets the era of the tokens the source issues (default 0). Raise it, once, after the
// counters went backwards (a replica promoted without the last acknowledged commits, a restore
// from a backup) and every fence of the group was moved to the new era with
// [fence.Sink.Recover].
func Era(n int64) Option {
	return func(c *config) error {
		if n < 0 {
			return fmt.Errorf("%w: pglease: era %d is negative", fence.ErrInvalid, n)
		}
		c.era = n
		return nil
	}
}
