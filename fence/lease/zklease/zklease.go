package zklease

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/lease"
	"github.com/batonhq/baton/internal/fencecheck"
)

// Source grants leases on ZooKeeper with the lock recipe: each [Source.Acquire] opens its own
// session, creates an ephemeral sequential node under the resource's path, and holds the lease
// once its node is the lowest; it waits by watching its predecessor only. The token is the
// node's czxid. Safe for concurrent use.
type Source struct {
	servers []string
	cfg     config
}

var _ lease.Source = (*Source)(nil)

// New returns a source on the ZooKeeper ensemble at servers ("host:port"). An empty server
// list, a nil option or an invalid option value fails with errors wrapping [fence.ErrInvalid],
// all of them joined. New does not connect; each Acquire does.
func New(servers []string, opts ...Option) (*Source, error) {
	cfg := config{
		sessionTimeout: defaultSessionTimeout,
		root:           defaultRoot,
		group:          defaultGroup,
		acl:            zk.WorldACL(zk.PermAll),
	}
	var errs []error
	if len(servers) == 0 {
		errs = append(errs, fmt.Errorf("%w: zklease: no servers", fence.ErrInvalid))
	}
	for i, o := range opts {
		if o == nil {
			errs = append(errs, fmt.Errorf("%w: zklease: option %d is nil", fence.ErrInvalid, i))
			continue
		}
		if err := o(&cfg); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Source{servers: slices.Clone(servers), cfg: cfg}, nil
}

// Acquire blocks until the caller holds resource or ctx ends. It opens a session (a server
// that cannot be reached fails when ctx ends, with the last connection error), creates its
// node and waits for its turn. The lease's context ends when the session expires, stays
// disconnected for the session timeout (it may have expired on the server), or the node is
// deleted. Release closes the session, which deletes the node.
func (s *Source) Acquire(ctx context.Context, resource string) (*lease.Lease, error) {
	k := lease.Key(s.cfg.group, resource)
	if err := fencecheck.ValidateKey(k); err != nil {
		return nil, fmt.Errorf("zklease: resource: %w", err)
	}
	fail := func(what string, err error) (*lease.Lease, error) {
		return nil, fmt.Errorf("zklease: acquire %q: %s: %w", resource, what, err)
	}
	m := &monitor{timeout: s.cfg.sessionTimeout, user: s.cfg.logger, lostCh: make(chan struct{}), connected: make(chan struct{}), done: make(chan struct{})}
	dialer := s.cfg.dialer
	if dialer == nil {
		dialer = net.DialTimeout
	}
	conn, events, err := zk.Connect(s.servers, s.cfg.sessionTimeout, zk.WithLogger(m), zk.WithLogInfo(false), zk.WithDialer(dialer))
	if err != nil {
		return fail("connect", err)
	}
	m.conn = conn
	go m.run(events)
	closeConn := func() { conn.Close(); <-m.done }
	// The client's calls take no context: ctx ending closes the session, which fails them.
	stop := context.AfterFunc(ctx, conn.Close)
	abort := func(what string, err error) (*lease.Lease, error) {
		stop()
		closeConn()
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", context.Cause(ctx), err)
		}
		return fail(what, err)
	}
	select {
	case <-m.connected:
	case <-ctx.Done():
		return abort("no session with "+strings.Join(s.servers, ","), m.lastError())
	}
	for _, a := range s.cfg.auth {
		if err := conn.AddAuth(a.scheme, a.auth); err != nil {
			return abort("auth", err)
		}
	}
	dir := s.cfg.root + "/" + url.PathEscape(resource)
	if err := ensurePath(conn, dir, s.cfg.acl); err != nil {
		return abort("create "+dir, err)
	}
	node, err := conn.CreateProtectedEphemeralSequential(dir+"/lock-", nil, s.cfg.acl)
	if err != nil {
		return abort("create lock node", err)
	}
	m.setNode(node)
	for {
		children, _, err := conn.Children(dir)
		if err != nil {
			return abort("list "+dir, err)
		}
		pred, ours := predecessor(children, node[len(dir)+1:])
		if !ours {
			return abort("wait", fmt.Errorf("%w: node %s is gone: session expired", lease.ErrLost, node))
		}
		if pred == "" {
			break
		}
		exists, _, ch, err := conn.ExistsW(dir + "/" + pred)
		if err != nil {
			return abort("watch "+pred, err)
		}
		if !exists {
			continue
		}
		select {
		case <-ch:
		case <-m.lostCh:
			return abort("wait", m.cause())
		case <-ctx.Done():
			return abort("wait for "+pred, ctx.Err())
		}
	}
	// Held. The token is the node's czxid; the data watch set here reports its deletion.
	exists, stat, _, err := conn.ExistsW(node)
	if err != nil {
		return abort("stat "+node, err)
	}
	if !exists {
		return abort("stat", fmt.Errorf("%w: node %s is gone", lease.ErrLost, node))
	}
	if !stop() {
		closeConn()
		return fail("acquired too late", context.Cause(ctx))
	}
	l, lost, err := lease.Grant(k, fence.Token{Era: s.cfg.era, Epoch: stat.Czxid}, node, func(context.Context) error {
		closeConn() // closing the session deletes the ephemeral node
		return nil
	})
	if err != nil {
		closeConn()
		return fail("grant", err)
	}
	m.setLost(lost)
	return l, nil
}

// ensurePath creates dir and its parents as persistent nodes if they are missing.
func ensurePath(conn *zk.Conn, dir string, acl []zk.ACL) error {
	p := ""
	for _, part := range strings.Split(dir[1:], "/") {
		p += "/" + part
		if _, err := conn.Create(p, nil, 0, acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return err
		}
	}
	return nil
}

// predecessor returns the child just before ours in sequence order ("" if ours is the
// lowest), and whether ours is among children at all.
func predecessor(children []string, ours string) (string, bool) {
	seq := func(name string) int64 {
		i := strings.LastIndex(name, "-")
		n, err := strconv.ParseInt(name[i+1:], 10, 64)
		if err != nil {
			return -1
		}
		return n
	}
	mine := seq(ours)
	pred, best, found := "", int64(-1), false
	for _, c := range children {
		if c == ours {
			found = true
			continue
		}
		if n := seq(c); n >= 0 && n < mine && n > best {
			pred, best = c, n
		}
	}
	return pred, found
}

// monitor follows one session's events: it reports the first session, and turns expiry, a
// disconnection longer than the session timeout, or the deletion of the lease's node into the
// loss of the lease, and then closes the session. It also is the client's logger, to remember the last connection error.
type monitor struct {
	timeout   time.Duration
	user      zk.Logger
	conn      *zk.Conn
	connected chan struct{} // closed at the first session
	lostCh    chan struct{} // closed at the loss
	done      chan struct{} // closed when run returns (the connection closed)

	mu      sync.Mutex
	node    string
	lostFn  func(error)
	lost    error
	lastErr string
	conn1   bool
}

func (m *monitor) Printf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if strings.Contains(msg, "failed to connect") || strings.Contains(msg, "authentication failed") {
		m.mu.Lock()
		m.lastErr = msg
		m.mu.Unlock()
	}
	if m.user != nil {
		m.user.Printf("%s", msg)
	}
}

func (m *monitor) lastError() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.lastErr == "" {
		return errors.New("no connection yet")
	}
	return errors.New(m.lastErr)
}

func (m *monitor) setNode(n string) {
	m.mu.Lock()
	m.node = n
	m.mu.Unlock()
}

func (m *monitor) setLost(f func(error)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lostFn = f
	if m.lost != nil {
		f(m.lost)
	}
}

func (m *monitor) cause() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return fmt.Errorf("%w: %w", lease.ErrLost, m.lost)
}

func (m *monitor) lose(cause error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.lost != nil {
		return
	}
	m.lost = cause
	close(m.lostCh)
	if m.lostFn != nil {
		m.lostFn(cause)
	}
	// A holder that gave up must not come back: ZooKeeper keeps sessions across a server
	// restart, so without this a reconnect would revive the node and block every successor
	// until Release. Close waits at most a second for the server's answer.
	m.conn.Close()
}

func (m *monitor) run(events <-chan zk.Event) {
	defer close(m.done)
	var timer *time.Timer
	var expire <-chan time.Time
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				m.lose(errors.New("zookeeper session closed"))
				return
			}
			switch ev.State {
			case zk.StateHasSession:
				m.mu.Lock()
				if !m.conn1 {
					m.conn1 = true
					close(m.connected)
				}
				m.mu.Unlock()
				if timer != nil {
					timer.Stop()
					timer, expire = nil, nil
				}
			case zk.StateExpired:
				m.lose(errors.New("zookeeper session expired"))
			case zk.StateDisconnected:
				if timer == nil {
					timer = time.NewTimer(m.timeout)
					expire = timer.C
				}
			}
			m.mu.Lock()
			node := m.node
			m.mu.Unlock()
			if ev.Type == zk.EventNodeDeleted && node != "" && ev.Path == node {
				m.lose(fmt.Errorf("lock node %s deleted", node))
			}
		case <-expire:
			m.lose(fmt.Errorf("disconnected from zookeeper for the session timeout %s", m.timeout))
			expire = nil
		}
	}
}
