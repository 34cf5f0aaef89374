package k8slease_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	typedv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/lease"
	"github.com/batonhq/baton/fence/lease/k8slease"
	"github.com/batonhq/baton/internal/memfence"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const ns = "baton"

// fakeLeases is client-go's fake clientset, NOT a real API server. Its object tracker ignores
// resourceVersion on update, so a reactor adds the API server's optimistic concurrency, on
// which the source's safety rests: an update whose resourceVersion is not the stored one fails
// with a Conflict, and every write bumps it.
func fakeLeases(t *testing.T) typedv1.LeaseInterface {
	cs := fake.NewClientset()
	var mu sync.Mutex
	rv := 0
	gvr := coordinationv1.SchemeGroupVersion.WithResource("leases")
	cs.PrependReactor("create", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		obj := a.(k8stesting.CreateAction).GetObject().(*coordinationv1.Lease)
		rv++
		obj.ResourceVersion = strconv.Itoa(rv)
		return false, nil, nil // the tracker stores it
	})
	cs.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		obj := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease)
		cur, err := cs.Tracker().Get(gvr, obj.Namespace, obj.Name)
		if err != nil {
			return true, nil, err
		}
		if cur.(*coordinationv1.Lease).ResourceVersion != obj.ResourceVersion {
			return true, nil, apierrors.NewConflict(gvr.GroupResource(), obj.Name, errors.New("resourceVersion changed"))
		}
		obj = obj.DeepCopy()
		if testing.Verbose() {
			t.Logf("update %s rv %s -> %d holder %v transitions %v", obj.Name, obj.ResourceVersion, rv+1, deref(obj.Spec.HolderIdentity), deref(obj.Spec.LeaseTransitions))
		}
		rv++
		obj.ResourceVersion = strconv.Itoa(rv)
		if err := cs.Tracker().Update(gvr, obj, obj.Namespace); err != nil {
			return true, nil, err
		}
		return true, obj, nil
	})
	return cs.CoordinationV1().Leases(ns)
}

func newSource(t *testing.T, l typedv1.LeaseInterface, name string, opts ...k8slease.Option) *k8slease.Source {
	t.Helper()
	s, err := k8slease.New(l, name, append([]k8slease.Option{k8slease.Duration(time.Second), k8slease.RenewEvery(200 * time.Millisecond), k8slease.RetryEvery(20 * time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestNewRejectsAllProblems(t *testing.T) {
	_, err := k8slease.New(nil, "", k8slease.Duration(0), nil, k8slease.RenewEvery(0), k8slease.Era(-1), k8slease.Group(""), k8slease.Clock(nil))
	if !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("New = %v, want ErrInvalid", err)
	}
	for _, want := range []string{"nil Lease client", "empty identity", "duration", "option 1 is nil", "renew", "era", "group", "clock"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("New error %q does not mention %q", err, want)
		}
	}
}

func TestAcquireReleaseOrder(t *testing.T) {
	leases := fakeLeases(t)
	src := newSource(t, leases, "pod-a")
	ctx := ctxT(t, 10*time.Second)
	if _, err := src.Acquire(ctx, "Not_A_Name"); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("Acquire(bad name) = %v, want ErrInvalid", err)
	}
	a, err := src.Acquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if a.Key() != lease.Key(k8slease.DefaultGroup, "job") || a.Token() != (fence.Token{Epoch: 1}) {
		t.Fatalf("lease key %v token %s", a.Key(), a.Token())
	}
	got := make(chan *lease.Lease, 1)
	go func() {
		b, err := newSource(t, leases, "pod-b").Acquire(ctx, "job")
		if err != nil {
			t.Error(err)
		}
		got <- b
	}()
	select {
	case <-got:
		t.Fatal("a second holder acquired while the first renewed")
	case <-time.After(1500 * time.Millisecond): // past the duration: renewals keep it
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	b := <-got
	if b == nil {
		t.FailNow()
	}
	defer b.Release(ctx)
	if b.Token() != (fence.Token{Epoch: 2}) {
		t.Fatalf("second token %s, want 0.2", b.Token())
	}
}

func put(v string) func(context.Context, *memfence.Tx) error {
	return func(_ context.Context, tx *memfence.Tx) error { return tx.Put("v", []byte(v)) }
}

// TestZombie: A stops renewing (a frozen process, simulated in-process: its renew interval is
// an hour), B takes the Lease over once the duration has passed, and A's write under its old
// token is refused by the sink.
func TestZombie(t *testing.T) {
	leases := fakeLeases(t)
	sink, _ := memfence.New()
	ctx := ctxT(t, 10*time.Second)
	a, err := newSource(t, leases, "pod-a", k8slease.RenewEvery(time.Hour)).Acquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	if _, err := lease.Claim(ctx, sink, a); err != nil {
		t.Fatal(err)
	}
	if err := lease.Apply(ctx, sink, a, 1, put("a1")); err != nil {
		t.Fatal(err)
	}
	b, err := newSource(t, leases, "pod-b").Acquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	if a.Token().Compare(b.Token()) >= 0 {
		t.Fatalf("B's token %s not above A's %s", b.Token(), a.Token())
	}
	if _, err := lease.Claim(ctx, sink, b); err != nil {
		t.Fatal(err)
	}
	if err := lease.Apply(ctx, sink, b, 2, put("b2")); err != nil {
		t.Fatal(err)
	}
	err = sink.Apply(ctx, a.Key(), a.Token(), 3, 3, put("a3"))
	var stale *fence.StaleError
	if !errors.As(err, &stale) || stale.Stored != b.Token() {
		t.Fatalf("zombie write = %v, want stale with B's token stored", err)
	}
	if v, _ := sink.Get("v"); string(v) != "b2" {
		t.Fatalf("value %q, want b2", v)
	}
	select {
	case <-a.Context().Done():
	case <-ctx.Done():
		t.Fatal("A never learned it lost the Lease")
	}
}

// TestInFlight: while A's write is in flight, the Lease's holder is changed behind its back
// (kubectl edit, another controller); A's renewal sees it, and the write fails with ErrLost
// without committing.
func TestInFlight(t *testing.T) {
	leases := fakeLeases(t)
	sink, _ := memfence.New()
	ctx := ctxT(t, 10*time.Second)
	a, err := newSource(t, leases, "pod-a", k8slease.RenewEvery(50*time.Millisecond)).Acquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	if _, err := lease.Claim(ctx, sink, a); err != nil {
		t.Fatal(err)
	}
	err = lease.Apply(ctx, sink, a, 1, func(ctx context.Context, tx *memfence.Tx) error {
		if err := tx.Put("v", []byte("a1")); err != nil {
			return err
		}
		cur, err := leases.Get(ctx, "job", metav1.GetOptions{})
		if err != nil {
			return err
		}
		intruder := "intruder"
		cur.Spec.HolderIdentity = &intruder
		if _, err := leases.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return err
		}
		<-ctx.Done()
		return nil
	})
	if !errors.Is(err, lease.ErrLost) || !strings.Contains(err.Error(), "intruder") {
		t.Fatalf("in-flight write = %v, want ErrLost naming the new holder", err)
	}
	if _, ok := sink.Get("v"); ok {
		t.Fatal("the in-flight write committed")
	}
}

// TestOneWinnerPerTransition: holders racing for an expired Lease each need a compare-and-set
// on its resourceVersion, so exactly one wins; it raises leaseTransitions from 5 to 6, and
// its token is leaseTransitions + 1 = 7.
func TestOneWinnerPerTransition(t *testing.T) {
	leases := fakeLeases(t)
	old := metav1.NewMicroTime(time.Now().Add(-time.Hour))
	holder, secs, tr := "gone", int32(1), int32(5)
	if _, err := leases.Create(context.Background(), &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "job"},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, RenewTime: &old, LeaseTransitions: &tr},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var won []*lease.Lease
	for i := range 8 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			l, err := newSource(t, leases, fmt.Sprintf("pod-%d", i)).Acquire(ctx, "job")
			if err == nil {
				mu.Lock()
				won = append(won, l)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, l := range won {
		defer l.Release(context.Background())
	}
	if len(won) != 1 || won[0].Token() != (fence.Token{Epoch: 7}) {
		t.Fatalf("%d winners %v, want 1 with token 0.7", len(won), won)
	}
}

// TestRecreatedLeaseRegresses: a Lease deleted and recreated starts leaseTransitions again;
// the new holder's token is below the stored one and the sink refuses it as stale.
func TestRecreatedLeaseRegresses(t *testing.T) {
	leases := fakeLeases(t)
	sink, _ := memfence.New()
	ctx := ctxT(t, 10*time.Second)
	src := newSource(t, leases, "pod-a")
	for range 3 {
		l, err := src.Acquire(ctx, "job")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := lease.Claim(ctx, sink, l); err != nil {
			t.Fatal(err)
		}
		_ = l.Release(ctx)
	}
	if err := leases.Delete(ctx, "job", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	l, err := src.Acquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	var stale *fence.StaleError
	if _, err := lease.Claim(ctx, sink, l); !errors.As(err, &stale) || stale.Stored != (fence.Token{Epoch: 3}) {
		t.Fatalf("claim after recreation = %v, want stale (stored 0.3)", err)
	}
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}
