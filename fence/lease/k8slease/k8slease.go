package k8slease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	typedv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/lease"
	"github.com/batonhq/baton/internal/fencecheck"
)

// Source grants Kubernetes Leases (coordination.k8s.io/v1) in one namespace: the resource is
// the Lease object's name. Each acquisition is a compare-and-set update (by resourceVersion)
// that sets holderIdentity to a name unique to the grant and increments leaseTransitions; the
// token is {Era, leaseTransitions + 1}. Safe for concurrent use.
type Source struct {
	leases    typedv1.LeaseInterface
	identity  string
	cfg       config
	durationS int32
}

var _ lease.Source = (*Source)(nil)

// New returns a source on the Leases of one namespace (clientset.CoordinationV1().Leases(ns)).
// identity names this process in holderIdentity (each grant appends a random suffix). A nil
// client, an empty identity, a nil option or an invalid option value fails with errors
// wrapping [fence.ErrInvalid], all of them joined.
func New(leases typedv1.LeaseInterface, identity string, opts ...Option) (*Source, error) {
	cfg := config{duration: DefaultDuration, retry: DefaultRetry, group: DefaultGroup, now: time.Now}
	var errs []error
	if leases == nil {
		errs = append(errs, fmt.Errorf("%w: k8slease: nil Lease client", fence.ErrInvalid))
	}
	if identity == "" {
		errs = append(errs, fmt.Errorf("%w: k8slease: empty identity", fence.ErrInvalid))
	}
	for i, o := range opts {
		if o == nil {
			errs = append(errs, fmt.Errorf("%w: k8slease: option %d is nil", fence.ErrInvalid, i))
			continue
		}
		if err := o(&cfg); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.renew == 0 {
		cfg.renew = cfg.duration / 3
	}
	secs := int32((cfg.duration + time.Second - 1) / time.Second)
	return &Source{leases: leases, identity: identity, cfg: cfg, durationS: secs}, nil
}

// Acquire blocks until the caller holds the Lease named resource or ctx ends. A Lease that
// does not exist is created; one whose holder has not renewed within its duration, or that
// was released, is taken over; otherwise Acquire looks again every RetryEvery. An API error
// other than a lost race fails Acquire with the cause. The lease's context ends when a
// renewal finds another holder, or when the holder could not renew within the duration.
// Release clears holderIdentity.
func (s *Source) Acquire(ctx context.Context, resource string) (*lease.Lease, error) {
	k := lease.Key(s.cfg.group, resource)
	if err := fencecheck.ValidateKey(k); err != nil {
		return nil, fmt.Errorf("k8slease: resource: %w", err)
	}
	if msgs := validation.IsDNS1123Subdomain(resource); len(msgs) > 0 {
		return nil, fmt.Errorf("%w: k8slease: resource %q is not a Lease name: %v", fence.ErrInvalid, resource, msgs)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	id := s.identity + "/" + hex.EncodeToString(b[:])
	for {
		got, err := s.try(ctx, resource, id)
		if err != nil {
			return nil, fmt.Errorf("k8slease: acquire %q: %w", resource, err)
		}
		if got != nil {
			return s.grant(k, got, id)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("k8slease: acquire %q: %w", resource, context.Cause(ctx))
		case <-time.After(s.cfg.retry):
		}
	}
}

// try makes one attempt: the Lease as written if it is now ours, nil if it is held or the
// race was lost.
func (s *Source) try(ctx context.Context, name, id string) (*coordinationv1.Lease, error) {
	now := metav1.NewMicroTime(s.cfg.now())
	cur, err := s.leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity: &id, LeaseDurationSeconds: &s.durationS,
				AcquireTime: &now, RenewTime: &now, LeaseTransitions: ptr(int32(0)),
			},
		}
		created, err := s.leases.Create(ctx, l, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil, nil
		}
		return created, err
	}
	if err != nil {
		return nil, err
	}
	if held(cur.Spec, s.cfg.now()) {
		return nil, nil
	}
	next := cur.DeepCopy()
	tr := int32(0)
	if cur.Spec.LeaseTransitions != nil {
		tr = *cur.Spec.LeaseTransitions
	}
	next.Spec.HolderIdentity, next.Spec.LeaseDurationSeconds = &id, &s.durationS
	next.Spec.AcquireTime, next.Spec.RenewTime = &now, &now
	next.Spec.LeaseTransitions = ptr(tr + 1)
	updated, err := s.leases.Update(ctx, next, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		return nil, nil
	}
	return updated, err
}

// held reports whether a Lease has a holder that renewed within its duration.
func held(spec coordinationv1.LeaseSpec, now time.Time) bool {
	if spec.HolderIdentity == nil || *spec.HolderIdentity == "" || spec.RenewTime == nil || spec.LeaseDurationSeconds == nil {
		return false
	}
	return now.Before(spec.RenewTime.Add(time.Duration(*spec.LeaseDurationSeconds) * time.Second))
}

func (s *Source) grant(k fence.Key, l *coordinationv1.Lease, id string) (*lease.Lease, error) {
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != id || l.Spec.LeaseTransitions == nil {
		return nil, fmt.Errorf("k8slease: acquire %q: the API server returned a Lease not held by %s", k.Topic, id)
	}
	r := &renewer{s: s, name: l.Name, id: id, last: s.cfg.now(), stop: make(chan struct{}), done: make(chan struct{})}
	tok := fence.Token{Era: s.cfg.era, Epoch: int64(*l.Spec.LeaseTransitions) + 1}
	ls, lost, err := lease.Grant(k, tok, id, r.release)
	if err != nil {
		return nil, err
	}
	r.lost = lost
	go r.run()
	return ls, nil
}

// renewer owns one grant after Acquire: it renews the Lease every RenewEvery, checking that
// the holder is still this grant, and reports the loss when it is not, or when no renewal has
// succeeded within the duration (the Lease may have been taken over meanwhile).
type renewer struct {
	s          *Source
	name, id   string
	last       time.Time
	lost       func(error)
	stop, done chan struct{}
}

func (r *renewer) run() {
	defer close(r.done)
	for {
		select {
		case <-r.stop:
			return
		case <-time.After(min(r.s.cfg.renew, time.Until(r.last.Add(r.s.cfg.duration)))):
		}
		if r.s.cfg.now().Sub(r.last) >= r.s.cfg.duration {
			r.lost(fmt.Errorf("lease %s not renewed within %s", r.name, r.s.cfg.duration))
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), r.s.cfg.renew)
		err := r.renew(ctx)
		cancel()
		var other *otherHolder
		if errors.As(err, &other) {
			r.lost(err)
			return
		}
		if err == nil {
			r.last = r.s.cfg.now()
		}
	}
}

type otherHolder struct{ name, holder string }

func (e *otherHolder) Error() string { return fmt.Sprintf("lease %s is held by %q", e.name, e.holder) }

func (r *renewer) renew(ctx context.Context) error {
	cur, err := r.s.leases.Get(ctx, r.name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if h := cur.Spec.HolderIdentity; h == nil || *h != r.id {
		holder := ""
		if h != nil {
			holder = *h
		}
		return &otherHolder{r.name, holder}
	}
	now := metav1.NewMicroTime(r.s.cfg.now())
	cur.Spec.RenewTime = &now
	_, err = r.s.leases.Update(ctx, cur, metav1.UpdateOptions{})
	return err
}

// release stops renewing and, if the Lease is still ours, clears its holder so a successor
// need not wait for the duration. leaseTransitions is kept: the next holder increments it.
func (r *renewer) release(ctx context.Context) error {
	close(r.stop)
	<-r.done
	cur, err := r.s.leases.Get(ctx, r.name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if h := cur.Spec.HolderIdentity; h == nil || *h != r.id {
		return nil
	}
	cur.Spec.HolderIdentity = nil
	_, err = r.s.leases.Update(ctx, cur, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		return nil // someone else wrote it: no longer ours to release
	}
	return err
}

func ptr[T any](v T) *T { return &v }
