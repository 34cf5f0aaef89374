package etcdlease

import (
	"fmt"
	"strings"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/lease"
	"github.com/batonhq/baton/internal/fencecheck"
)

// Defaults of the options (each option's doc states its own).
const (
	defaultTTL    = 10 * time.Second
	defaultPrefix = "/baton/lease/"
	defaultGroup  = "lease:etcd"
)

type config struct {
	ttl    time.Duration
	prefix string
	group  string
	era    int64
}

// Option configures a [Source].
type Option func(*config) error

// TTL sets the etcd lease's time to live (default 10s), in whole seconds (rounded up). A
// holder that cannot keep the lease alive for this long (paused, partitioned) loses it, and a
// successor may acquire after it. etcd raises a TTL below its minimum (about 1.5 times the
// election timeout, 2s with the defaults) to that minimum. Below one second fails with
// [fence.ErrInvalid].
func TTL(d time.Duration) Option {
	return func(c *config) error {
		if d < time.Second {
			return fmt.Errorf("%w: etcdlease: TTL %s is below one second", fence.ErrInvalid, d)
		}
		c.ttl = d
		return nil
	}
}

// Prefix sets the key prefix of the lock keys (default "/baton/lease/"). A resource's lock
// keys live under Prefix + url.PathEscape(resource) + "/", one per waiting holder, as in the
// etcd concurrency package's Mutex. It must end in "/" so that resources cannot overlap.
func Prefix(p string) Option {
	return func(c *config) error {
		if p == "" || !strings.HasSuffix(p, "/") {
			return fmt.Errorf("%w: etcdlease: prefix %q must be non-empty and end in /", fence.ErrInvalid, p)
		}
		c.prefix = p
		return nil
	}
}

// Group sets the fence key group of the leases (default "lease:etcd"; see [lease.Key]). Give
// each etcd cluster its own group if one sink fences resources of several clusters: their
// revisions are not comparable.
func Group(name string) Option {
	return func(c *config) error {
		if err := fencecheck.ValidateKey(lease.Key(name, "x")); err != nil {
			return fmt.Errorf("etcdlease: group: %w", err)
		}
		c.group = name
		return nil
	}
}

// Era sets the era of the tokens the source issues (default 0). Raise it, once, after the
// cluster's revisions went backwards (restored from an old snapshot) and every fence of the
// group was moved to the new era with [fence.Sink.Recover]; until then the sink refuses the
// regressed tokens as stale.
func Era(n int64) Option {
	return func(c *config) error {
		if n < 0 {
			return fmt.Errorf("%w: etcdlease: era %d is negative", fence.ErrInvalid, n)
		}
		c.era = n
		return nil
	}
}
