package lincheck

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
)

// TestCheckerCatchesMutants runs the SQLite workload against deliberately broken wrappers of
// the store and requires porcupine to find each history not linearizable: the check is only
// worth something if it can fail.
func TestCheckerCatchesMutants(t *testing.T) {
	mutants := []struct {
		name string
		wrap func(*target) *target
	}{
		{"stale-read", func(tg *target) *target {
			// Load answers from a cache shared by all clients, refreshed one time in three.
			var mu sync.Mutex
			cache := map[fence.Key]fence.State{}
			var n atomic.Int64
			m := *tg
			m.load = func(ctx context.Context, k fence.Key) (fence.State, error) {
				mu.Lock()
				st, ok := cache[k]
				mu.Unlock()
				if ok && n.Add(1)%3 != 0 {
					return st, nil
				}
				st, err := tg.load(ctx, k)
				if err == nil {
					mu.Lock()
					cache[k] = st
					mu.Unlock()
				}
				return st, err
			}
			return &m
		}},
		{"equal-token-other-claimant-reported-claimed", func(tg *target) *target {
			// A store that answers an equal-token claim by another claimant with success.
			m := *tg
			m.claim = func(ctx context.Context, k fence.Key, tok fence.Token, claimant string) (fence.State, error) {
				st, err := tg.claim(ctx, k, tok, claimant)
				var se *fence.StaleError
				if errors.As(err, &se) && se.Stored == se.Presented {
					cur, lerr := tg.load(ctx, k)
					if lerr != nil {
						return st, err
					}
					cur.Claimant = claimant
					return cur, nil
				}
				return st, err
			}
			return &m
		}},
		{"duplicate-reported-applied", func(tg *target) *target {
			m := *tg
			m.apply = func(ctx context.Context, k fence.Key, tok fence.Token, first, last int64) error {
				if err := tg.apply(ctx, k, tok, first, last); !errors.Is(err, fence.ErrDuplicate) {
					return err
				}
				return nil
			}
			return &m
		}},
		{"applied-reported-stale", func(tg *target) *target {
			var n atomic.Int64
			m := *tg
			m.apply = func(ctx context.Context, k fence.Key, tok fence.Token, first, last int64) error {
				err := tg.apply(ctx, k, tok, first, last)
				if err == nil && n.Add(1)%4 == 0 {
					return &fence.StaleError{Key: k, Stored: tok, Presented: tok}
				}
				return err
			}
			return &m
		}},
	}
	for _, mu := range mutants {
		t.Run(mu.name, func(t *testing.T) {
			s, err := sqlitefence.Open(filepath.Join(t.TempDir(), "fence.db"))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if _, err := s.DB().Exec(createData); err != nil {
				t.Fatalf("create data table: %v", err)
			}
			tgt := mu.wrap(sqliteTarget(s))
			h := newHistory()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			w := workload{
				keys:     []fence.Key{{Group: "g", Topic: "t", Partition: 0}},
				clients:  3,
				calls:    150,
				opTimout: time.Second,
				tgt:      func() *target { return tgt },
			}
			w.run(ctx, h, uint64(time.Now().UnixNano()))
			if res, _ := h.linearizable(t); res != porcupine.Illegal {
				t.Fatalf("mutant %s: porcupine says %s, want Illegal", mu.name, res)
			}
		})
	}
}
