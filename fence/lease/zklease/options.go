package zklease

import (
	"fmt"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/lease"
	"github.com/batonhq/baton/internal/fencecheck"
)

// Defaults of the options (each option's doc states its own).
const (
	defaultSessionTimeout = 10 * time.Second
	defaultRoot           = "/baton/lease"
	defaultGroup          = "lease:zookeeper"
)

type config struct {
	sessionTimeout time.Duration
	root           string
	group          string
	era            int64
	acl            []zk.ACL
	dialer         zk.Dialer
	logger         zk.Logger
	auth           []authInfo
}

type authInfo struct {
	scheme string
	auth   []byte
}

// Option configures a [Source].
type Option func(*config) error

// SessionTimeout sets the ZooKeeper session timeout each lease's session asks for (default
// 10s). A holder whose session expires (paused or cut off for this long) loses its node and
// the next in line acquires. The server clamps it to [minSessionTimeout, maxSessionTimeout]
// (2 and 20 ticks by default). Below 100ms fails with [fence.ErrInvalid].
func SessionTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < 100*time.Millisecond {
			return fmt.Errorf("%w: zklease: session timeout %s is below 100ms", fence.ErrInvalid, d)
		}
		c.sessionTimeout = d
		return nil
	}
}

// Root sets the path under which the lock nodes live (default "/baton/lease"): a resource's
// nodes are ephemeral sequential children of Root + "/" + url.PathEscape(resource). It must be
// an absolute path without a trailing slash.
func Root(path string) Option {
	return func(c *config) error {
		if !strings.HasPrefix(path, "/") || strings.HasSuffix(path, "/") || strings.Contains(path, "//") {
			return fmt.Errorf("%w: zklease: root %q must be an absolute path without a trailing or double slash", fence.ErrInvalid, path)
		}
		c.root = path
		return nil
	}
}

// Group sets the fence key group of the leases (default "lease:zookeeper"; see [lease.Key]).
// Give each ensemble its own group if one sink fences resources of several: their zxids are not
// comparable.
func Group(name string) Option {
	return func(c *config) error {
		if err := fencecheck.ValidateKey(lease.Key(name, "x")); err != nil {
			return fmt.Errorf("zklease: group: %w", err)
		}
		c.group = name
		return nil
	}
}

// Era sets the era of the tokens the source issues (default 0). Raise it, once, after the
// ensemble's zxids went backwards (its data was wiped or restored from an old snapshot) and
// every fence of the group was moved to the new era with [fence.Sink.Recover].
func Era(n int64) Option {
	return func(c *config) error {
		if n < 0 {
			return fmt.Errorf("%w: zklease: era %d is negative", fence.ErrInvalid, n)
		}
		c.era = n
		return nil
	}
}

// ACL sets the ACL of the nodes the source creates (default zk.WorldACL(zk.PermAll)).
func ACL(acl ...zk.ACL) Option {
	return func(c *config) error {
		if len(acl) == 0 {
			return fmt.Errorf("%w: zklease: empty ACL", fence.ErrInvalid)
		}
		c.acl = acl
		return nil
	}
}

// Dialer sets how the sessions dial the servers (default net.DialTimeout), e.g. for TLS.
func Dialer(d zk.Dialer) Option {
	return func(c *config) error {
		if d == nil {
			return fmt.Errorf("%w: zklease: nil dialer", fence.ErrInvalid)
		}
		c.dialer = d
		return nil
	}
}

// Auth adds credentials every session presents (zk.Conn.AddAuth), e.g. "digest", "user:pass".
func Auth(scheme string, auth []byte) Option {
	return func(c *config) error {
		if scheme == "" {
			return fmt.Errorf("%w: zklease: empty auth scheme", fence.ErrInvalid)
		}
		c.auth = append(c.auth, authInfo{scheme, auth})
		return nil
	}
}

// Logger receives the ZooKeeper client's log lines (default: discarded).
func Logger(l zk.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return fmt.Errorf("%w: zklease: nil logger", fence.ErrInvalid)
		}
		c.logger = l
		return nil
	}
}
