package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/fencecheck"
)

// Source grants ownership of named resources: etcdlease, zklease and pglease implement it.
type Source interface {
	// Acquire blocks until the caller owns resource, then returns the [Lease]. It fails with
	// ctx's error if ctx ends first, and with the cause if the service cannot be reached; it
	// never returns a lease the service has not granted. A resource must be a valid
	// [fence.Key] topic: non-empty, at most 1024 bytes, UTF-8 without NUL.
	Acquire(ctx context.Context, resource string) (*Lease, error)
}

// Key is the fence key of a resource: Group is the source's group (by default
// "lease:<source>"), Topic is the resource name, Partition is 0. Tokens of different sources
// (an etcd revision, a ZooKeeper zxid, a PostgreSQL counter) are not comparable, so each source
// fences its resources under its own group; moving a resource from one source to another is a
// new fence key (or a [fence.Sink.Recover] of the old one).
func Key(group, resource string) fence.Key {
	return fence.Key{Group: group, Topic: resource, Partition: 0}
}

// Lease is the ownership of one resource, granted by a [Source]: a fence key, the token the
// source issued, and a context that ends when ownership ends. Its methods are safe for
// concurrent use.
//
// The context is a hint, not the guarantee: it ends when the holder learns that ownership
// ended, which can be long after the service gave the resource to someone else (a holder
// paused past its TTL learns it when it wakes). The guarantee is the sink's fence: once the
// successor has claimed with its higher token, every write under this lease's token is refused
// with a *[fence.StaleError]. Write through [Claim] and [Apply], which do both.
type Lease struct {
	key     fence.Key
	token   fence.Token
	id      string
	ctx     context.Context
	cancel  context.CancelCauseFunc
	release func(context.Context) error

	once   sync.Once
	relErr error
}

// Grant builds the Lease a [Source] hands out, for Source implementations. id is the source's
// name for the grant, for logs (an etcd lease ID, a ZooKeeper node path, a PostgreSQL backend
// pid and a random suffix), unique per grant: the sink's claimant is made of it. release gives the grant back to the service; [Lease.Release] calls it at most once.
// The returned lost function ends the lease's context with a cause wrapping [ErrLost] and
// cause; the source calls it when it learns that ownership ended (calls after the first, or
// after Release, do nothing). Invalid arguments fail with errors wrapping [fence.ErrInvalid],
// all of them joined.
func Grant(k fence.Key, t fence.Token, id string, release func(context.Context) error) (*Lease, func(cause error), error) {
	var errs []error
	if err := fencecheck.ValidateKey(k); err != nil {
		errs = append(errs, err)
	}
	if err := fencecheck.ValidateToken(t); err != nil {
		errs = append(errs, err)
	}
	if t.IsZero() {
		errs = append(errs, fmt.Errorf("%w: the zero token is \"no owner\"; a grant needs a positive token", fence.ErrInvalid))
	}
	if release == nil {
		errs = append(errs, fmt.Errorf("%w: nil release function", fence.ErrInvalid))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	l := &Lease{key: k, token: t, id: id, ctx: ctx, cancel: cancel, release: release}
	lost := func(cause error) {
		if cause == nil {
			cancel(ErrLost)
			return
		}
		cancel(fmt.Errorf("%w: %w", ErrLost, cause))
	}
	return l, lost, nil
}

// Key returns the fence key the lease writes under (see [Key]).
func (l *Lease) Key() fence.Key { return l.key }

// Token returns the fencing token the source issued with this grant.
func (l *Lease) Token() fence.Token { return l.token }

// ID returns the source's name for the grant (an etcd lease ID, a ZooKeeper node path, a
// PostgreSQL backend pid and a random suffix, "pid/suffix"), for logs.
func (l *Lease) ID() string { return l.id }

// Context returns a context that ends when ownership ends: lost (its cause wraps [ErrLost])
// or released (cause [ErrReleased]). Run the owner's work under it, as with the etcd
// concurrency package's Session.Ctx. Its Done channel is closed when ownership ends, and
// context.Cause(l.Context()) is nil while the lease is held, then why it ended.
func (l *Lease) Context() context.Context { return l.ctx }

// err returns nil while the lease is held, and then why it ended: an error wrapping
// [ErrLost] or [ErrReleased].
func (l *Lease) err() error {
	if l.ctx.Err() == nil {
		return nil
	}
	return context.Cause(l.ctx)
}

// Release ends the lease's context with [ErrReleased] and gives the grant back to the service,
// so a successor need not wait for the TTL. Call it when done, also after the lease was lost:
// it frees what the source holds for the grant (a session, a connection, a goroutine). Calls
// after the first return the first call's result.
func (l *Lease) Release(ctx context.Context) error {
	l.once.Do(func() {
		l.cancel(ErrReleased)
		if err := l.release(ctx); err != nil {
			l.relErr = fmt.Errorf("lease: release %s: %w", l.key, err)
		}
	})
	return l.relErr
}

// Claim raises the sink's fence for the lease's key to the lease's token (a new owner's first
// step: the returned state's Position is where it resumes). A lease already ended fails with
// its cause and claims nothing. A higher stored token fails with a *[fence.StaleError]: either
// a successor has claimed (this lease was lost), or the source's tokens went backwards (an etcd
// restored from an old snapshot, a PostgreSQL replica promoted without the last commits); the
// sink never accepts it silently, and only [fence.Sink.Recover], after proof that this holder is
// the current owner, moves the fence to a new era.
func Claim[Tx any](ctx context.Context, s fence.Sink[Tx], l *Lease) (fence.State, error) {
	ctx, stop := l.bind(ctx)
	defer stop()
	if err := l.err(); err != nil {
		return fence.State{}, err
	}
	st, err := s.Claim(ctx, l.key, l.token, l.claimant())
	if err != nil {
		return st, l.annotate(err)
	}
	return st, nil
}

// Apply is [fence.Sink.Apply] under the lease's key and token: fn's writes and the fence
// check-and-advance to position commit together or not at all. fn's context ends when the
// lease ends, so a loss noticed during the write cancels it (the store rolls back). A write
// the successor's claim has overtaken fails with a *[fence.StaleError] and commits nothing,
// whether or not this holder has noticed the loss yet. When the lease has ended, the error
// also wraps its cause ([ErrLost] or [ErrReleased]); a lease that had already ended when Apply
// was called fails with its cause and does not reach the sink. Position must grow with every write, as
// for Sink.Apply: the first after [Claim] is the claimed Position + 1.
func Apply[Tx any](ctx context.Context, s fence.Sink[Tx], l *Lease, position int64, fn func(ctx context.Context, tx Tx) error) error {
	ctx, stop := l.bind(ctx)
	defer stop()
	if err := l.err(); err != nil {
		return err
	}
	guarded := func(ctx context.Context, tx Tx) error {
		if fn != nil {
			if err := fn(ctx, tx); err != nil {
				return err
			}
		}
		// A loss noticed while fn ran stops the commit even on a store that does not watch
		// the context at commit time.
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return nil
	}
	if err := s.Apply(ctx, l.key, l.token, position, position, guarded); err != nil {
		return l.annotate(err)
	}
	return nil
}

// claimant is the identity the sink stores with the lease's token: the grant's id, unique per
// acquisition, so that of two holders presenting one token (a source whose tokens went
// backwards) at most one holds it.
func (l *Lease) claimant() string { return "lease/" + l.id }

// bind returns a context that ends when ctx or the lease ends, with the lease's cause.
func (l *Lease) bind(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	if l.ctx.Err() != nil {
		cancel(context.Cause(l.ctx))
		return ctx, func() {}
	}
	stop := context.AfterFunc(l.ctx, func() { cancel(context.Cause(l.ctx)) })
	return ctx, func() { stop(); cancel(nil) }
}

// annotate adds the lease's end to a failed write's error, keeping both in the chain.
func (l *Lease) annotate(err error) error {
	cause := l.err()
	if cause == nil || errors.Is(err, cause) {
		return err
	}
	return fmt.Errorf("%w (%w)", err, cause)
}
