// Package k8slease is a Kubernetes Lease (coordination.k8s.io/v1) token source for
// fence/lease. It is its own Go module, so that k8s.io/client-go stays out of Baton's module
// graph; it depends on Baton through a replace directive to the repository root.
//
// NOT PROVEN AGAINST A REAL API SERVER. No Kubernetes API server runs on Baton's machines: the
// tests use client-go's fake clientset (k8s.io/client-go/kubernetes/fake), whose object
// tracker ignores resourceVersion on update; a reactor in the tests adds the API server's
// optimistic concurrency (a stale resourceVersion fails with a Conflict). Everything below
// that depends on the real server's behaviour is the documented API contract, not a
// measurement.
//
// # How it works
//
// The resource is the name of a Lease object in the namespace of the client given to [New].
// Acquire creates the Lease if it is missing, or takes it over when its holder has not renewed
// within leaseDurationSeconds (or released it), with an update conditional on the
// resourceVersion it read: of several racing acquirers exactly one wins. Every acquisition sets
// holderIdentity to a name unique to the grant (the identity given to New plus a random
// suffix) and increments leaseTransitions; the token is {Era, leaseTransitions + 1} (so the
// creator, at 0 transitions, gets 1: the zero token means "no owner"). The holder renews
// renewTime every RenewEvery, checking that holderIdentity is still its own; the lease's
// context ends when it is not (someone took over or edited the Lease), or when no renewal has
// succeeded for the duration. Release clears holderIdentity, so the next holder need not wait.
//
// # Why the token is safe, and what it relies on
//
// Each successive holder's acquisition is a compare-and-set from the Lease its predecessor
// wrote, incrementing leaseTransitions, so holders of one Lease get strictly increasing
// tokens. Expiry is judged by comparing the holder's renewTime (the holder's clock) with the
// acquirer's clock, so a clock jump (or skew beyond the margin) lets a successor take over a
// live holder: the token, checked by the sink, is what keeps the two apart. Every holder of a
// Lease must use this source (client-go's leaderelection, for one, does not increment
// leaseTransitions when the same identity re-acquires).
//
// # What the token survives
//
//   - API server restarts and failover: the Lease is in etcd, written through the API server's
//     optimistic concurrency.
//   - Deletion and recreation of the Lease object, or an etcd restore behind the API server:
//     NOT survived. leaseTransitions starts again (or goes back), and the sink refuses the new
//     holders as stale (TestRecreatedLeaseRegresses) until an operator recovers the key with
//     fence.Sink.Recover and raises [Era].
//
// Acquire latency was not measured: there is no real API server here.
package k8slease
