package memfence

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/fencecheck"
)

var (
	_ fence.Sink[*Tx]      = (*Store)(nil)
	_ fence.KeyedSink[*Tx] = (*Store)(nil)
)

// Option configures a [Store]. Invalid values make [New] fail.
type Option func(*config) error

type config struct {
	now func() time.Time
}

// Clock sets the clock that stamps [fence.Recovery.At]. The default is time.Now. The time is
// informational only; no decision of the store depends on it.
func Clock(now func() time.Time) Option {
	return func(c *config) error {
		if now == nil {
			return fmt.Errorf("%w: memfence: nil clock", fence.ErrInvalid)
		}
		c.now = now
		return nil
	}
}

// Store is an in-memory fenced sink with a small key/value area for the caller's own data.
// It is safe for concurrent use. The zero value is not usable; call [New].
type Store struct {
	now func() time.Time

	mu         sync.Mutex // guards the maps below; never held while waiting for a key
	fences     map[fence.Key]fence.State
	recoveries map[fence.Key][]fence.Recovery
	topics     map[topicName][]fence.TopicRecord
	entities   map[entity]admission
	data       map[string][]byte
	locks      map[any]*keyLock // by fence.Key or entity; present while held or awaited
}

type entity struct{ scope, id string }

type admission struct {
	token fence.Token
	seq   int64
}

// keyLock is the per-key lock a transaction holds from its first change of the key until it
// ends, the in-memory counterpart of a database row lock. A channel rather than a sync.Mutex
// so that waiting for it can give up when the context ends.
type keyLock struct {
	ch   chan struct{} // capacity 1: the holder is whoever sent the value in
	refs int           // holders and waiters; the entry is removed when it drops to zero
}

// New returns an empty store. A nil option or an invalid value fails with an error wrapping
// fence.ErrInvalid; every problem is reported, joined with errors.Join.
func New(opts ...Option) (*Store, error) {
	c := config{now: time.Now}
	var errs []error
	for i, o := range opts {
		if o == nil {
			errs = append(errs, fmt.Errorf("%w: memfence: option %d is nil", fence.ErrInvalid, i))
			continue
		}
		if err := o(&c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Store{
		now:        c.now,
		fences:     map[fence.Key]fence.State{},
		recoveries: map[fence.Key][]fence.Recovery{},
		topics:     map[topicName][]fence.TopicRecord{},
		entities:   map[entity]admission{},
		data:       map[string][]byte{},
		locks:      map[any]*keyLock{},
	}, nil
}

// acquire waits for the lock of name, or until ctx ends.
func (s *Store) acquire(ctx context.Context, name any) (*keyLock, error) {
	s.mu.Lock()
	l := s.locks[name]
	if l == nil {
		l = &keyLock{ch: make(chan struct{}, 1)}
		s.locks[name] = l
	}
	l.refs++
	s.mu.Unlock()
	if err := ctx.Err(); err == nil {
		select {
		case l.ch <- struct{}{}:
			return l, nil
		case <-ctx.Done():
		}
	}
	s.unref(name, l)
	return nil, ctx.Err()
}

func (s *Store) release(name any, l *keyLock) {
	<-l.ch
	s.unref(name, l)
}

func (s *Store) unref(name any, l *keyLock) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.refs--; l.refs == 0 {
		delete(s.locks, name)
	}
}

// state returns the committed state of k. The caller holds s.mu.
func (s *Store) state(k fence.Key) fence.State {
	if st, ok := s.fences[k]; ok {
		return st
	}
	return fence.State{Position: fence.NoPosition}
}

// withKey runs fn holding k's lock and s.mu: a change that commits at once.
func (s *Store) withKey(ctx context.Context, k fence.Key, fn func() error) error {
	l, err := s.acquire(ctx, k)
	if err != nil {
		return err
	}
	defer s.release(k, l)
	s.mu.Lock()
	defer s.mu.Unlock()
	return fn()
}

// Claim implements [fence.Sink.Claim]. It waits for a transaction that holds k.
func (s *Store) Claim(ctx context.Context, k fence.Key, t fence.Token, claimant string) (fence.State, error) {
	if err := fencecheck.ValidateClaim(k, t, claimant); err != nil {
		return fence.State{}, err
	}
	var st fence.State
	err := s.withKey(ctx, k, func() error {
		st = s.state(k)
		if err := fencecheck.CheckClaim(k, st, t, claimant); err != nil {
			return err
		}
		st.Token, st.Claimant = t, claimant
		s.fences[k] = st
		return nil
	})
	if err != nil {
		return fence.State{}, err
	}
	return st, nil
}

// Load implements [fence.Sink.Load]. It does not wait: it reads the committed state.
func (s *Store) Load(ctx context.Context, k fence.Key) (fence.State, error) {
	if err := fencecheck.ValidateKey(k); err != nil {
		return fence.State{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state(k), nil
}

// Apply implements [fence.Sink.Apply]: [Store.Begin], [Store.Advance], fn, [Tx.Commit]. A nil
// fn only advances the fence.
func (s *Store) Apply(ctx context.Context, k fence.Key, t fence.Token, first, last int64, fn func(ctx context.Context, tx *Tx) error) error {
	tx, err := s.Begin(ctx)
	if err != nil {
		return err
	}
	// After Commit this only reports ErrTxDone; if fn panics it releases the key.
	defer func() { _ = tx.Rollback() }()
	if err := s.Advance(ctx, tx, k, t, first, last); err != nil {
		return err
	}
	if fn != nil {
		if err := fn(ctx, tx); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// Advance implements [fence.Sink.Advance]. From its first success until tx ends, tx holds k:
// other writers and claimers of k wait.
func (s *Store) Advance(ctx context.Context, tx *Tx, k fence.Key, t fence.Token, first, last int64) error {
	if err := s.checkTx(tx); err != nil {
		return err
	}
	if err := fencecheck.ValidateWrite(k, t, first, last); err != nil {
		return err
	}
	if err := tx.lock(ctx, k); err != nil {
		return err
	}
	st, ok := tx.fences[k]
	if !ok {
		s.mu.Lock()
		st = s.state(k)
		s.mu.Unlock()
	}
	if err := fencecheck.CheckAdvance(k, st, t, first, last); err != nil {
		return err
	}
	st.Position = last
	tx.fences[k] = st
	return nil
}

// Recover implements [fence.Sink.Recover].
func (s *Store) Recover(ctx context.Context, k fence.Key, expected fence.Token, epoch int64, claimant, reason string) (fence.Token, error) {
	if err := fencecheck.ValidateRecover(k, expected, epoch, claimant, reason); err != nil {
		return fence.Token{}, err
	}
	if expected.Era == math.MaxInt64 {
		return fence.Token{}, fmt.Errorf("%w: %s: era %d cannot be raised", fence.ErrInvalid, k, expected.Era)
	}
	next := fence.Token{Era: expected.Era + 1, Epoch: epoch}
	err := s.withKey(ctx, k, func() error {
		st := s.state(k)
		if st.Token != expected {
			return fmt.Errorf("%w: %s: stored token %s, expected %s", fence.ErrConflict, k, st.Token, expected)
		}
		s.recoveries[k] = append(s.recoveries[k], fence.Recovery{Key: k, From: st.Token, To: next, Reason: reason, At: s.now()})
		st.Token, st.Claimant = next, claimant
		s.fences[k] = st
		return nil
	})
	if err != nil {
		return fence.Token{}, err
	}
	return next, nil
}

// Recoveries implements [fence.Sink.Recoveries].
func (s *Store) Recoveries(ctx context.Context, k fence.Key) ([]fence.Recovery, error) {
	if err := fencecheck.ValidateKey(k); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.recoveries[k]), nil
}

// Admit implements [fence.KeyedSink.Admit]. From its first call for (scope, id) until tx ends,
// tx holds that entity: other admissions of it wait.
func (s *Store) Admit(ctx context.Context, tx *Tx, scope, id string, t fence.Token, seq int64) (fence.Verdict, error) {
	if err := s.checkTx(tx); err != nil {
		return 0, err
	}
	if err := fencecheck.ValidateAdmit(scope, id, t, seq); err != nil {
		return 0, err
	}
	e := entity{scope, id}
	if err := tx.lock(ctx, e); err != nil {
		return 0, err
	}
	a, found := tx.admits[e]
	if !found {
		s.mu.Lock()
		a, found = s.entities[e]
		s.mu.Unlock()
	}
	v := fencecheck.CheckAdmit(a.token, a.seq, found, t, seq)
	if v == fence.Admitted {
		tx.admits[e] = admission{token: t, seq: seq}
	}
	return v, nil
}

// Get returns a copy of the committed value of key in the user key/value area.
func (s *Store) Get(key string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.data[key]
	return slices.Clone(v), ok
}

// Begin starts a transaction. It never waits: keys are taken as the transaction changes them.
func (s *Store) Begin(ctx context.Context) (*Tx, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return &Tx{
		s:      s,
		held:   map[any]*keyLock{},
		fences: map[fence.Key]fence.State{},
		admits: map[entity]admission{},
		puts:   map[string][]byte{},
	}, nil
}

func (s *Store) checkTx(tx *Tx) error {
	switch {
	case tx == nil:
		return fmt.Errorf("%w: nil transaction", fence.ErrInvalid)
	case tx.s != s:
		return fmt.Errorf("%w: transaction of another store", fence.ErrInvalid)
	case tx.done:
		return ErrTxDone
	}
	return nil
}

// Tx is a transaction of a [Store]: it stages fence advances, admissions and key/value writes
// and applies them all on Commit, or none on Rollback. A Tx is used by one goroutine at a time.
type Tx struct {
	s      *Store
	done   bool
	held   map[any]*keyLock
	fences map[fence.Key]fence.State
	admits map[entity]admission
	puts   map[string][]byte
}

func (tx *Tx) lock(ctx context.Context, name any) error {
	if _, ok := tx.held[name]; ok {
		return nil
	}
	l, err := tx.s.acquire(ctx, name)
	if err != nil {
		return err
	}
	tx.held[name] = l
	return nil
}

// Put stages value (copied) under key in the user key/value area.
func (tx *Tx) Put(key string, value []byte) error {
	if tx.done {
		return ErrTxDone
	}
	tx.puts[key] = slices.Clone(value)
	return nil
}

// Get returns a copy of key's value as this transaction sees it: its own staged write, or else
// the committed one.
func (tx *Tx) Get(key string) ([]byte, bool) {
	if v, ok := tx.puts[key]; ok {
		return slices.Clone(v), true
	}
	return tx.s.Get(key)
}

// Commit makes everything tx staged visible at once and releases its keys.
func (tx *Tx) Commit() error {
	if tx.done {
		return ErrTxDone
	}
	s := tx.s
	s.mu.Lock()
	for k, st := range tx.fences {
		s.fences[k] = st
	}
	for e, a := range tx.admits {
		s.entities[e] = a
	}
	for k, v := range tx.puts {
		s.data[k] = v
	}
	s.mu.Unlock()
	tx.end()
	return nil
}

// Rollback drops everything tx staged and releases its keys. After Commit it returns
// ErrTxDone and changes nothing, so it can be deferred.
func (tx *Tx) Rollback() error {
	if tx.done {
		return ErrTxDone
	}
	tx.end()
	return nil
}

func (tx *Tx) end() {
	tx.done = true
	for name, l := range tx.held {
		tx.s.release(name, l)
	}
	tx.held = nil
}

type topicName struct{ group, topic string }

var _ fence.Topics = (*Store)(nil)

// SeeTopic implements [fence.Topics.SeeTopic].
func (s *Store) SeeTopic(ctx context.Context, group, topic string, seen fence.Topic, reason string) (fence.Topic, bool, error) {
	if err := fencecheck.ValidateTopic(group, topic, seen); err != nil {
		return fence.Topic{}, false, err
	}
	if reason == "" {
		return fence.Topic{}, false, fmt.Errorf("%w: adopting a topic needs a reason", fence.ErrInvalid)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := topicName{group, topic}
	stored, found := s.topic(n)
	// The key only names the topic here; the partition rule does not apply to an adoption.
	adopt, _ := fencecheck.CheckTopic(fence.Key{Group: group, Topic: topic, Partition: 0}, stored, found, seen)
	if adopt == nil {
		return stored, false, nil
	}
	s.topics[n] = append(s.topics[n], fence.TopicRecord{Group: group, Topic: topic, Seq: int64(len(s.topics[n]) + 1),
		Identity: *adopt, Reason: reason, At: s.now()})
	return *adopt, true, nil
}

// topic returns the stored identity of n. The caller holds s.mu.
func (s *Store) topic(n topicName) (fence.Topic, bool) {
	h := s.topics[n]
	if len(h) == 0 {
		return fence.Topic{}, false
	}
	return h[len(h)-1].Identity, true
}

// ResetTopic implements [fence.Topics.ResetTopic]. A recreated topic's reset waits for the
// transactions holding any of its fences, and covers partitions 0..max(partitions)-1 whether
// or not they have a fence yet, so that a claim racing the reset is judged after it.
func (s *Store) ResetTopic(ctx context.Context, group, topic string, expected, to fence.Topic, reason string) error {
	if err := fencecheck.ValidateReset(group, topic, expected, to, reason); err != nil {
		return err
	}
	n := topicName{group, topic}
	s.mu.Lock()
	stored, found := s.topic(n)
	recreated, err := fencecheck.CheckTopicReset(group, topic, stored, found, expected, to)
	var keys []fence.Key
	if err == nil && recreated {
		for p := range max(stored.Partitions, to.Partitions) {
			keys = append(keys, fence.Key{Group: group, Topic: topic, Partition: p})
		}
		for k := range s.fences {
			if k.Group == group && k.Topic == topic && k.Partition >= max(stored.Partitions, to.Partitions) {
				keys = append(keys, k)
			}
		}
		slices.SortFunc(keys, func(a, b fence.Key) int { return int(a.Partition) - int(b.Partition) })
	}
	s.mu.Unlock()
	if err != nil {
		return err
	}
	for _, k := range keys {
		l, err := s.acquire(ctx, k)
		if err != nil {
			return err
		}
		defer s.release(k, l)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	stored, found = s.topic(n)
	if _, err := fencecheck.CheckTopicReset(group, topic, stored, found, expected, to); err != nil {
		return err
	}
	now := s.now()
	for _, k := range keys {
		st := s.state(k)
		next := fencecheck.ResetToken(st.Token)
		s.recoveries[k] = append(s.recoveries[k], fence.Recovery{Key: k, From: st.Token, To: next, Reason: reason, At: now})
		reset := fence.State{Token: next, Position: fence.NoPosition}
		if fencecheck.Sealed(st.Token) {
			reset.Claimant = st.Claimant
		}
		s.fences[k] = reset
	}
	s.topics[n] = append(s.topics[n], fence.TopicRecord{Group: group, Topic: topic, Seq: int64(len(s.topics[n]) + 1),
		Identity: to, Reason: reason, At: now})
	return nil
}

// TopicHistory implements [fence.Topics.TopicHistory].
func (s *Store) TopicHistory(ctx context.Context, group, topic string) ([]fence.TopicRecord, error) {
	if err := fencecheck.ValidateKey(fence.Key{Group: group, Topic: topic}); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.topics[topicName{group, topic}]), nil
}
