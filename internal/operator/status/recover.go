package status

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"slices"
	"strings"

	"github.com/batonhq/baton/fence"
)

// RecoverRequest is an operator's era advance.
type RecoverRequest struct {
	Topic      string  // required
	Partitions []int32 // nil: every partition of Topic with a fence row for the group
	Reason     string  // required; recorded with the recovery
	Force      bool    // recover even a partition a live member owns
	// Epoch is the epoch of the new token {stored era+1, Epoch}. 0 (the default) accepts the
	// next owner at any generation: its claim carries the new era and its own epoch.
	Epoch    int64
	Claimant string // who asks, recorded: see [Claimant]
}

// Recovered is one partition's outcome.
type Recovered struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	From      string `json:"from"`
	To        string `json:"to"`
	Forced    bool   `json:"forced,omitempty"` // a live member owned it
}

// Claimant names the operator running this process: "operator:<user>@<host>".
func Claimant() string {
	name := "unknown"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return "operator:" + name + "@" + host
}

// Recover advances the era of the requested partitions' fences, each by one recorded
// compare-and-set from its stored token. It checks everything before changing anything: no
// reason, an unreachable source, a partition without a fence row or one a live member owns
// (without Force) fails and changes nothing. It returns what it recovered; a compare-and-set
// lost to a concurrent claim stops it there with an error wrapping fence.ErrConflict.
func (c *Collector) Recover(ctx context.Context, req RecoverRequest) ([]Recovered, error) {
	if c.Sharded() {
		return nil, errUnsharded()
	}
	var errs []error
	if strings.TrimSpace(req.Reason) == "" {
		errs = append(errs, errorf(ErrUsage, "recover needs a reason (-reason): it is recorded with the recovery"))
	}
	if req.Topic == "" {
		errs = append(errs, errorf(ErrUsage, "recover needs a topic (-topic)"))
	}
	if req.Epoch < 0 {
		errs = append(errs, errorf(ErrUsage, "epoch %d is negative", req.Epoch))
	}
	if req.Claimant == "" {
		req.Claimant = Claimant()
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	st, err := OpenStore(sctx, c.cfg.Store, c.cfg.Tables, ReadWrite)
	cancel()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	fences, err := st.Fences(ctx, c.cfg.Group)
	if err != nil {
		return nil, err
	}
	var targets []Fence
	for _, f := range fences {
		if f.Topic == req.Topic && (req.Partitions == nil || slices.Contains(req.Partitions, f.Partition)) {
			targets = append(targets, f)
		}
	}
	for _, p := range req.Partitions {
		if !slices.ContainsFunc(targets, func(f Fence) bool { return f.Partition == p }) {
			errs = append(errs, errorf(ErrNotFound, "%s has no fence row for %s/%s/%d: nothing to recover", st.Describe(), c.cfg.Group, req.Topic, p))
		}
	}
	if len(targets) == 0 && len(errs) == 0 {
		errs = append(errs, errorf(ErrNotFound, "%s has no fence rows for group %q on topic %q: nothing to recover", st.Describe(), c.cfg.Group, req.Topic))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	// Who owns them now: never recover under a live owner by accident.
	kv, err := c.readKafka(ctx, []string{req.Topic})
	if err != nil && !req.Force {
		return nil, fmt.Errorf("%w (recover checks that no live member owns the partition; -force skips the check)", err)
	}
	owned := map[int32]*Member{}
	if kv != nil {
		for _, f := range targets {
			if m := kv.owner[fence.Key{Group: c.cfg.Group, Topic: f.Topic, Partition: f.Partition}]; m != nil {
				owned[f.Partition] = m
				if !req.Force {
					errs = append(errs, errorf(ErrLiveOwner, "%s/%s/%d is owned by live member %s (token %s); stop it or pass -force", c.cfg.Group, f.Topic, f.Partition, m, f.Token))
				}
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	sink, err := st.sink()
	if err != nil {
		return nil, err
	}
	var done []Recovered
	for _, f := range targets {
		k := fence.Key{Group: c.cfg.Group, Topic: f.Topic, Partition: f.Partition}
		cur, err := sink.Load(ctx, k)
		if err != nil {
			return done, fmt.Errorf("loading the fence of %s from %s: %w", k, st.Describe(), err)
		}
		to, err := sinkRecover(ctx, sink, k, cur.Token, req.Epoch, req.Claimant, req.Reason)
		if err != nil {
			return done, fmt.Errorf("recovering %s in %s: %w", k, st.Describe(), err)
		}
		done = append(done, Recovered{Topic: f.Topic, Partition: f.Partition, From: cur.Token.String(), To: to.String(), Forced: owned[f.Partition] != nil})
	}
	return done, nil
}

// sinkRecover is the one call of fence.Sink.Recover in the operator's tools: the new era's token
// is held by the operator's claimant, and the reason records who too (the recoveries table
// keeps reasons, not claimants).
func sinkRecover(ctx context.Context, s recoverer, k fence.Key, expected fence.Token, epoch int64, claimant, reason string) (fence.Token, error) {
	return s.Recover(ctx, k, expected, epoch, claimant, reason+" (by "+claimant+")")
}
