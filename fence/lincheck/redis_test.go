package lincheck

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/redisfence"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// redisData is the stream of partition part's data rows: one entry per committed Apply, so
// that two commits of one batch would both show.
func redisData(part int32) string { return "lin-data:" + strconv.FormatInt(int64(part), 10) }

func redisTarget(s *redisfence.Store) *target {
	return &target{
		claim: func(ctx context.Context, k fence.Key, t fence.Token, claimant string) (fence.State, error) {
			return s.Claim(ctx, k, t, claimant)
		},
		load: s.Load,
		apply: func(ctx context.Context, k fence.Key, t fence.Token, first, last int64) error {
			return s.Apply(ctx, k, t, first, last, func(ctx context.Context, tx *redisfence.Tx) error {
				tx.XAdd(redisData(k.Partition), "first", strconv.FormatInt(first, 10), "last", strconv.FormatInt(last, 10),
					"era", strconv.FormatInt(t.Era, 10), "epoch", strconv.FormatInt(t.Epoch, 10))
				return nil
			})
		},
		recover: func(ctx context.Context, k fence.Key, expected fence.Token, epoch int64, claimant string) (fence.Token, error) {
			return s.Recover(ctx, k, expected, epoch, claimant, "lincheck")
		},
		effect: func(ctx context.Context, _ opKind, _ error) (outcome, bool) {
			// A script sent before the server was killed ran entirely (and was fsynced:
			// appendfsync always) or not at all. A call whose own deadline expired was
			// abandoned while its script may still be queued on the connection: it may
			// take effect later.
			return outUnknown, ctx.Err() != nil
		},
	}
}

// TestRedis: four clients on a redis-server of the test's own (appendonly yes, appendfsync
// always), one call in four cancelled after a millisecond, and the server killed (SIGKILL) and
// restarted over its append-only file in the middle of the run. The client does not retry
// (MaxRetries -1): a retried script whose first attempt ran would report the second's verdict.
func TestRedis(t *testing.T) {
	srv := testenv.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	defer c.Close()
	s, err := redisfence.New(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := s.Check(ctx); err != nil {
		t.Fatal(err)
	}
	h := newHistory()
	tgt := redisTarget(s)
	w := workload{
		keys:       []fence.Key{{Group: "g", Topic: "t", Partition: 0}, {Group: "g", Topic: "t", Partition: 1}},
		clients:    4,
		calls:      300,
		opTimout:   2 * time.Second,
		shortEvery: 4,
		short:      time.Millisecond,
		tgt:        func() *target { return tgt },
		pace:       5 * time.Millisecond,
	}
	restarted := make(chan error, 1)
	var after atomic.Int64 // calls recorded when the server answered again, 0 before
	w.more = func() bool { n := after.Load(); return n == 0 || h.len() < int(n)+300 }
	go func() {
		for h.len() < 300 && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		srv.Kill()
		time.Sleep(50 * time.Millisecond) // calls fail while it is down
		err := srv.Start()
		after.Store(int64(h.len()) + 1)
		restarted <- err
	}()
	w.run(ctx, h, uint64(time.Now().UnixNano()))
	if err := <-restarted; err != nil {
		t.Fatalf("restart the server: %v", err)
	}
	if ctx.Err() != nil {
		t.Fatalf("the workload did not finish in time: %s", h.summary())
	}
	if h.outcomes(outUnknown) == 0 {
		t.Fatalf("no call was cut off: the faults did not happen (%s)", h.summary())
	}
	t.Logf("server killed and restarted after call %d: %s", after.Load(), h.summary())
	h.check(t)
	checkData(t, h, w.keys, func(part int32) ([]dataRow, error) {
		msgs, err := c.XRange(ctx, redisData(part), "-", "+").Result()
		if err != nil {
			return nil, err
		}
		var out []dataRow
		for _, m := range msgs {
			var d dataRow
			var errs [4]error
			d.first, errs[0] = strconv.ParseInt(m.Values["first"].(string), 10, 64)
			d.last, errs[1] = strconv.ParseInt(m.Values["last"].(string), 10, 64)
			d.tok.Era, errs[2] = strconv.ParseInt(m.Values["era"].(string), 10, 64)
			d.tok.Epoch, errs[3] = strconv.ParseInt(m.Values["epoch"].(string), 10, 64)
			if err := errors.Join(errs[:]...); err != nil {
				return nil, err
			}
			out = append(out, d)
		}
		slices.SortFunc(out, func(a, b dataRow) int { return int(a.first - b.first) })
		return out, nil
	}, func(k fence.Key) (fence.State, error) { return s.Load(ctx, k) })
}
