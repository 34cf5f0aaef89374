package k8slease

import (
	"fmt"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/lease"
	"github.com/batonhq/baton/internal/fencecheck"
)

// Defaults of the options.
const (
	DefaultDuration = 15 * time.Second
	DefaultRetry    = time.Second
	DefaultGroup    = "lease:kubernetes"
)

type config struct {
	duration time.Duration
	renew    time.Duration
	retry    time.Duration
	group    string
	era      int64
	now      func() time.Time
}

// Option configures a [Source].
type Option func(*config) error

// Duration sets the Lease's leaseDurationSeconds (default 15s), in whole seconds (rounded up):
// a holder that has not renewed for this long is considered gone, and another may take the
// Lease over. Below one second fails with [fence.ErrInvalid].
func Duration(d time.Duration) Option {
	return func(c *config) error {
		if d < time.Second {
			return fmt.Errorf("%w: k8slease: duration %s is below one second", fence.ErrInvalid, d)
		}
		c.duration = d
		return nil
	}
}

// RenewEvery sets how often the holder renews (default a third of the duration). It must be
// positive; a value not below the duration makes every holder lose its lease.
func RenewEvery(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: k8slease: renew interval %s is not positive", fence.ErrInvalid, d)
		}
		c.renew = d
		return nil
	}
}

// RetryEvery sets how often a waiting Acquire looks at the Lease again (default 1s).
func RetryEvery(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: k8slease: retry interval %s is not positive", fence.ErrInvalid, d)
		}
		c.retry = d
		return nil
	}
}

// Group sets the fence key group of the leases (default "lease:kubernetes"; see [lease.Key]).
// Give each cluster its own group if one sink fences Leases of several.
func Group(name string) Option {
	return func(c *config) error {
		if err := fencecheck.ValidateKey(lease.Key(name, "x")); err != nil {
			return fmt.Errorf("k8slease: group: %w", err)
		}
		c.group = name
		return nil
	}
}

// Era sets the era of the tokens the source issues (default 0). Raise it, once, after a
// Lease's leaseTransitions went backwards (the object was deleted and recreated, or etcd was
// restored) and its fence was moved to the new era with [fence.Sink.Recover].
func Era(n int64) Option {
	return func(c *config) error {
		if n < 0 {
			return fmt.Errorf("%w: k8slease: era %d is negative", fence.ErrInvalid, n)
		}
		c.era = n
		return nil
	}
}

// Clock sets the clock that stamps acquire and renew times and judges expiry (default
// time.Now). Kubernetes Leases compare one client's renewTime with another client's clock:
// a clock jump can make a live holder look expired, which is why the token, not the clock,
// is the guarantee.
func Clock(now func() time.Time) Option {
	return func(c *config) error {
		if now == nil {
			return fmt.Errorf("%w: k8slease: nil clock", fence.ErrInvalid)
		}
		c.now = now
		return nil
	}
}
