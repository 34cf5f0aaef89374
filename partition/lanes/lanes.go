package lanes

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/partition"
	"github.com/batonhq/baton/partition/ring"
)

// DefaultCount is the number of lanes [New] uses unless [Count] says otherwise.
const DefaultCount = 4

// MaxCount bounds [Count]. Building the lane ring costs time quadratic in the lane count (see
// ring.MaxPartitions); 64 lanes take about 10 ms.
const MaxCount = 64

// slots is the number of slots keys are hashed into (prime, as the consistent module advises).
const slots = 1021

// Lanes spreads one partition's records over parallel lanes by key, keeping per-key order: all
// records with the same key go to the same lane and run there one after another in offset
// order; records with different keys may run at the same time. Records without a key (nil
// Key) all go to lane 0, so they keep their order among themselves too.
//
// Lanes never decide who may write. They run inside the worker that owns the partition, under
// the token captured when the partition was assigned; the fence check happens where the data
// lives, as for a sequential worker. Lanes only choose which of the owner's goroutines runs a
// record.
//
// A key is mapped to a lane by consistent hashing with bounded loads (xxhash64 over 1021 slots,
// slots spread over the lanes with at most 1.1x the average share): lanes are private to one
// process, so the mapping need not be stable across processes or releases, but it is: a key
// always lands on the same lane for a given lane count.
//
// Lanes hold no mutable state: a *Lanes is safe for concurrent use, so one can serve every
// partition worker of a process (building one costs about a millisecond for 4 lanes), and each
// [Lanes.Run] call owns the goroutines it starts.
type Lanes struct {
	n     int
	table []int32 // slot -> lane
}

// Option configures [New]. An invalid value makes New fail.
type Option func(*config) error

type config struct{ count int }

// Count sets the number of lanes, which bounds how many records of one partition run at once.
// Default [DefaultCount]; 1 runs the batch sequentially on the caller's goroutine; at most
// [MaxCount].
func Count(n int) Option {
	return func(c *config) error {
		if n < 1 || n > MaxCount {
			return fmt.Errorf("%w: lane count %d, want 1..%d", partition.ErrInvalid, n, MaxCount)
		}
		c.count = n
		return nil
	}
}

// New returns Lanes configured by opts. It fails with partition.ErrInvalid if an option is nil
// or out of range, reporting every such option (errors.Join).
func New(opts ...Option) (*Lanes, error) {
	cfg := config{count: DefaultCount}
	var errs []error
	for i, o := range opts {
		if o == nil {
			errs = append(errs, fmt.Errorf("%w: option %d is nil", partition.ErrInvalid, i))
			continue
		}
		if err := o(&cfg); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	table, err := ring.Table(cfg.count, slots)
	if err != nil {
		return nil, err
	}
	return &Lanes{n: cfg.count, table: table}, nil
}

// Count returns the number of lanes.
func (l *Lanes) Count() int { return l.n }

// Lane returns the lane a key runs on, in [0, Count()). A nil key runs on lane 0.
func (l *Lanes) Lane(key []byte) int {
	if key == nil || l.n == 1 {
		return 0
	}
	return int(l.table[ring.Slot(key, slots)])
}

// laneMsg is what a lane reports to Run: a record's failure as soon as it happens, and when the
// lane stops, how many of its records (a prefix of its list) completed.
type laneMsg struct {
	lane     int
	rec      *kgo.Record
	err      error
	finished bool
	done     int
}

// Run calls fn for every record of one batch of one partition, spread over the lanes, and
// returns when every call has returned: no goroutine it starts outlives it.
//
// records must all come from the same topic and partition, in strictly increasing offset
// order (as a fetch returns them); otherwise Run fails with partition.ErrInvalid before calling
// fn.
//
// The first failure stops the batch: the ctx passed to every fn is cancelled, each lane stops
// before its next record, and Run returns the failure as a *partition.RecordError (unwrapping to fn's
// error). If ctx is cancelled (for example the partition was revoked) before every record ran,
// Run returns the context's cause.
//
// Run always returns the committable offset: the highest offset o of the batch such that fn
// returned nil for every record at or below o, or fence.NoPosition if the first record did not
// complete. It is the only position the caller may advance its fence or commit to: records
// above it may have completed too (on other lanes) and will be delivered again when the
// partition resumes from the committable offset, so their effects must tolerate a replay (be
// fenced per key, e.g. through an inbox, or be idempotent).
func (l *Lanes) Run(ctx context.Context, records []*kgo.Record, fn func(context.Context, *kgo.Record) error) (int64, error) {
	if fn == nil {
		return fence.NoPosition, fmt.Errorf("%w: nil record callback", partition.ErrInvalid)
	}
	if err := checkBatch(records); err != nil {
		return fence.NoPosition, err
	}
	tr := Tracker{pending: make([]pendingOffset, 0, len(records))}
	for _, r := range records {
		if err := tr.Start(r.Offset); err != nil { // checkBatch made this impossible
			return fence.NoPosition, err
		}
	}
	if l.n == 1 {
		return runSequential(ctx, &tr, records, fn)
	}
	byLane := make([][]*kgo.Record, l.n)
	used := 0
	for _, r := range records {
		i := l.Lane(r.Key)
		if len(byLane[i]) == 0 {
			used++
		}
		byLane[i] = append(byLane[i], r)
	}
	if used <= 1 {
		return runSequential(ctx, &tr, records, fn)
	}

	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	msgs := make(chan laneMsg, l.n)
	var wg sync.WaitGroup
	for lane, recs := range byLane {
		if len(recs) == 0 {
			continue
		}
		wg.Go(func() {
			done := 0
			for _, r := range recs {
				if lctx.Err() != nil {
					break
				}
				if err := fn(lctx, r); err != nil {
					msgs <- laneMsg{rec: r, err: err}
					break
				}
				done++
			}
			msgs <- laneMsg{lane: lane, finished: true, done: done}
		})
	}

	// This goroutine alone owns the tracker; the lanes only report to it. A lane completes its
	// records in order, so it reports how many once, at the end; a failure is reported at once
	// so that the other lanes stop early.
	var first error
	for running := used; running > 0; {
		m := <-msgs
		if !m.finished {
			if first == nil {
				first = recordError(m.rec, m.err)
				cancel()
			}
			continue
		}
		running--
		for _, r := range byLane[m.lane][:m.done] {
			// Each record was started above and is reported once, so Done cannot fail;
			// if it did, surface it rather than lose it.
			if err := tr.Done(r.Offset); err != nil && first == nil {
				first = err
				cancel()
			}
		}
	}
	wg.Wait()
	if first == nil && tr.Pending() > 0 {
		first = context.Cause(ctx)
	}
	return tr.Committable(), first
}

// runSequential is Run on the caller's goroutine, for one lane or a batch that maps to one.
func runSequential(ctx context.Context, tr *Tracker, records []*kgo.Record, fn func(context.Context, *kgo.Record) error) (int64, error) {
	for _, r := range records {
		if ctx.Err() != nil {
			return tr.Committable(), context.Cause(ctx)
		}
		if err := fn(ctx, r); err != nil {
			return tr.Committable(), recordError(r, err)
		}
		if err := tr.Done(r.Offset); err != nil { // impossible: started above, done once
			return tr.Committable(), err
		}
	}
	return tr.Committable(), nil
}

func recordError(r *kgo.Record, err error) error {
	return &partition.RecordError{ID: partition.Of(r), Offset: r.Offset, Key: r.Key, Err: err}
}

// checkBatch enforces Run's precondition: one partition, strictly increasing offsets.
func checkBatch(records []*kgo.Record) error {
	for i, r := range records {
		if r == nil {
			return fmt.Errorf("%w: record %d is nil", partition.ErrInvalid, i)
		}
		if i == 0 {
			if r.Offset < 0 {
				return fmt.Errorf("%w: record %s@%d has a negative offset", partition.ErrInvalid, partition.Of(r), r.Offset)
			}
			continue
		}
		p := records[i-1]
		if partition.Of(r) != partition.Of(p) {
			return fmt.Errorf("%w: batch mixes partitions %s and %s", partition.ErrInvalid, partition.Of(p), partition.Of(r))
		}
		if r.Offset <= p.Offset {
			return fmt.Errorf("%w: %s offsets not increasing: %d after %d", partition.ErrInvalid, partition.Of(r), r.Offset, p.Offset)
		}
	}
	return nil
}
