package etcdlease

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/lease"
	"github.com/batonhq/baton/internal/fencecheck"
)

// Source grants leases on etcd: one etcd lease and one lock key per [Source.Acquire], with the
// concurrency package's Mutex recipe (wait for every key created before ours to go). The token
// is the lock key's create revision. Safe for concurrent use.
type Source struct {
	cl  *clientv3.Client
	cfg config
}

var _ lease.Source = (*Source)(nil)

// New returns a source on cl, which the caller owns and closes after releasing every lease.
// A nil client, a nil option or an invalid option value fails with errors wrapping
// [fence.ErrInvalid], all of them joined.
func New(cl *clientv3.Client, opts ...Option) (*Source, error) {
	cfg := config{ttl: defaultTTL, prefix: defaultPrefix, group: defaultGroup}
	var errs []error
	if cl == nil {
		errs = append(errs, fmt.Errorf("%w: etcdlease: nil client", fence.ErrInvalid))
	}
	for i, o := range opts {
		if o == nil {
			errs = append(errs, fmt.Errorf("%w: etcdlease: option %d is nil", fence.ErrInvalid, i))
			continue
		}
		if err := o(&cfg); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Source{cl: cl, cfg: cfg}, nil
}

// Acquire blocks until the caller holds resource or ctx ends. It grants an etcd lease with the
// configured TTL (an unreachable cluster fails here, with the client's error), keeps it alive
// in the background, and waits its turn in the resource's queue. The lease's context ends when
// the etcd lease is no longer kept alive: it expired (the holder was paused or cut off for a
// TTL), was revoked, or the client was closed. Release revokes it.
func (s *Source) Acquire(ctx context.Context, resource string) (*lease.Lease, error) {
	k := lease.Key(s.cfg.group, resource)
	if err := fencecheck.ValidateKey(k); err != nil {
		return nil, fmt.Errorf("etcdlease: resource: %w", err)
	}
	ttl := int64((s.cfg.ttl + 999_999_999) / 1_000_000_000)
	// Grant under ctx: NewSession would grant under the client's context, which never ends
	// while the cluster is down.
	g, err := s.cl.Grant(ctx, ttl)
	if err != nil {
		// The client waits for a connection until ctx ends; say what the connection was doing.
		state := ""
		if cc := s.cl.ActiveConnection(); cc != nil && ctx.Err() != nil {
			state = " (connection " + cc.GetState().String() + ")"
		}
		return nil, fmt.Errorf("etcdlease: acquire %q: grant a lease from %v%s: %w", resource, s.cl.Endpoints(), state, err)
	}
	sess, err := concurrency.NewSession(s.cl, concurrency.WithLease(g.ID))
	if err != nil {
		s.revoke(g.ID)
		return nil, fmt.Errorf("etcdlease: acquire %q: keep lease %x alive: %w", resource, int64(g.ID), err)
	}
	m := concurrency.NewMutex(sess, s.cfg.prefix+url.PathEscape(resource))
	fail := func(what string, err error) (*lease.Lease, error) {
		sess.Orphan()
		s.revoke(g.ID)
		return nil, fmt.Errorf("etcdlease: acquire %q: %s: %w", resource, what, err)
	}
	if err := m.Lock(ctx); err != nil {
		return fail("wait for the lock", err)
	}
	// The token: our key's create revision, read back with a check that the key is still ours
	// (the lease may have expired between the lock and now).
	resp, err := s.cl.Get(ctx, m.Key())
	if err != nil {
		return fail("read the lock key", err)
	}
	if len(resp.Kvs) != 1 || resp.Kvs[0].Lease != int64(g.ID) {
		return fail("read the lock key", fmt.Errorf("%w: key %s is gone: lease %x expired", lease.ErrLost, m.Key(), int64(g.ID)))
	}
	tok := fence.Token{Era: s.cfg.era, Epoch: resp.Kvs[0].CreateRevision}
	id := strconv.FormatInt(int64(g.ID), 16)
	l, lost, err := lease.Grant(k, tok, id, func(ctx context.Context) error {
		sess.Orphan()
		if _, err := s.cl.Revoke(ctx, g.ID); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return fmt.Errorf("revoke etcd lease %s: %w", id, err)
		}
		return nil
	})
	if err != nil {
		return fail("grant", err)
	}
	// Session.Ctx ends when the keep-alive stops: expiry, revocation, Orphan or client close.
	context.AfterFunc(sess.Ctx(), func() {
		lost(fmt.Errorf("etcd lease %s is no longer kept alive (expired, revoked, or the client closed)", id))
	})
	return l, nil
}

// revoke gives a lease back on a failed Acquire, best effort and bounded by the TTL.
func (s *Source) revoke(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ttl)
	defer cancel()
	_, _ = s.cl.Revoke(ctx, id)
}
