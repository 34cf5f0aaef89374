package fencetest_test

import (
	"context"
	"errors"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/fencetest"
	"github.com/batonhq/baton/internal/memfence"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var validTable = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// memEnv is memfence with the optional hooks filled in, so every case of the suite runs here:
// Reopen keeps the same memory (memfence is not durable across processes; this exercises the
// suite's durability case, not memfence), Table checks names like a SQL store would.
func memEnv(t *testing.T) fencetest.Env[*memfence.Tx] {
	s, err := memfence.New()
	if err != nil {
		t.Fatal(err)
	}
	var env fencetest.Env[*memfence.Tx]
	env = fencetest.Env[*memfence.Tx]{
		Sink:  s,
		Keyed: s,
		Write: func(ctx context.Context, tx *memfence.Tx, key, value string) error {
			if value == "fail" {
				return errors.New("user write failed")
			}
			return tx.Put(key, []byte(value))
		},
		Read: func(ctx context.Context, key string) (string, bool, error) {
			v, ok := s.Get(key)
			return string(v), ok, nil
		},
		Begin: func(ctx context.Context) (*memfence.Tx, func() error, func() error, error) {
			tx, err := s.Begin(ctx)
			if err != nil {
				return nil, nil, nil, err
			}
			return tx, tx.Commit, tx.Rollback, nil
		},
		Reopen: func(testing.TB) fencetest.Env[*memfence.Tx] { return env },
		Table: func(name string) error {
			if !validTable.MatchString(name) {
				return fence.ErrInvalid
			}
			return nil
		},
	}
	return env
}

func TestSuite(t *testing.T) { fencetest.Run(t, memEnv) }

// mutants are broken stores, each with the cases that must catch it. TestMutants runs the suite
// against each in a child process and checks that those cases fail.
var mutants = map[string]struct {
	wrap  func(m *mutant)
	catch []string
}{
	"ApplyIgnoresToken": {
		wrap: func(m *mutant) { m.applyIgnoresToken = true },
		catch: []string{"LowerTokenRefused", "RaceHighestTokenWins", "AtomicStaleWriteInvisible",
			"RegressionAndRecover", "Duplicates"},
	},
	"ClaimIgnoresToken": {
		wrap:  func(m *mutant) { m.claimIgnoresToken = true },
		catch: []string{"LowerTokenRefused", "RegressionAndRecover", "Durability"},
	},
	"ApplyNotAtomic": {
		wrap:  func(m *mutant) { m.notAtomic = true },
		catch: []string{"AtomicUserWriteFails", "AtomicFnError"},
	},
	"DuplicatesReapplied": {
		wrap:  func(m *mutant) { m.reapplyDuplicates = true },
		catch: []string{"Duplicates", "Durability"},
	},
	"RecoverWithoutCompare": {
		wrap:  func(m *mutant) { m.recoverNoCAS = true },
		catch: []string{"RegressionAndRecover", "RecoverConcurrent"},
	},
	"AdmitAlways": {
		wrap:  func(m *mutant) { m.admitAlways = true },
		catch: []string{"KeyedVerdicts", "KeyedScopeIsolation", "KeyedAtomicity", "KeyedConcurrentSameMessage", "Durability"},
	},
	"NoValidation": {
		wrap:  func(m *mutant) { m.noValidation = true },
		catch: []string{"BadInput"},
	},
	"EqualTokenRefused": { // the classic bug: > instead of >=
		wrap:  func(m *mutant) { m.equalRefused = true },
		catch: []string{"EqualTokenManyBatches", "ResumePosition", "Duplicates", "RaceHighestTokenWins"},
	},
	"ClaimForgetsPosition": {
		wrap:  func(m *mutant) { m.claimForgetsPosition = true },
		catch: []string{"MonotonicClaims", "ResumePosition", "RegressionAndRecover", "AdvanceHoldsKeyUntilTxEnds"},
	},
	"EqualTokenOtherClaimantAccepted": { // the claimant is not checked
		wrap:  func(m *mutant) { m.claimIgnoresClaimant = true },
		catch: []string{"EqualTokenOneClaimant", "ClaimRaceOneClaimant"},
	},
	"WriteUnderUnclaimedToken": { // the old rule: a write under a higher token takes the fence
		wrap:  func(m *mutant) { m.writeTakesFence = true },
		catch: []string{"WriteNeedsClaimedToken", "MonotonicClaims"},
	},
	"OverlapApplied": { // the old rule: only the batch's last position is checked
		wrap:  func(m *mutant) { m.overlapApplied = true },
		catch: []string{"OverlapRefused"},
	},
	"TableAcceptsAll": {
		wrap:  func(m *mutant) { m.tableAcceptsAll = true },
		catch: []string{"TableNames"},
	},
}

const mutantEnv = "FENCETEST_MUTANT"

// TestMutant runs the suite against the mutant named by $FENCETEST_MUTANT; it is the child
// process of TestMutants and is skipped otherwise.
func TestMutant(t *testing.T) {
	name := os.Getenv(mutantEnv)
	if name == "" {
		t.Skip("run by TestMutants")
	}
	fencetest.Run(t, func(t *testing.T) fencetest.Env[*memfence.Tx] {
		env := memEnv(t)
		m := &mutant{Store: env.Sink.(*memfence.Store)}
		mutants[name].wrap(m)
		env.Sink, env.Keyed = m, m
		if m.tableAcceptsAll {
			env.Table = func(string) error { return nil }
		}
		var reopen func(testing.TB) fencetest.Env[*memfence.Tx]
		reopen = func(testing.TB) fencetest.Env[*memfence.Tx] { e := env; e.Reopen = reopen; return e }
		env.Reopen = reopen
		return env
	})
}

func TestMutants(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	for name, mu := range mutants {
		t.Run(name, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestMutant$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), mutantEnv+"="+name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed against the broken store %s", name)
			}
			failed := map[string]bool{}
			for _, m := range regexp.MustCompile(`--- FAIL: TestMutant/(\w+)`).FindAllStringSubmatch(string(out), -1) {
				failed[m[1]] = true
			}
			for _, c := range mu.catch {
				if !failed[c] {
					t.Errorf("case %s did not catch %s; failed: %v", c, name, slices.Sorted(maps.Keys(failed)))
				}
			}
			if t.Failed() {
				t.Logf("child output:\n%s", tail(string(out), 60))
			}
		})
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// mutant is memfence with one rule broken.
type mutant struct {
	*memfence.Store
	applyIgnoresToken, claimIgnoresToken, notAtomic, reapplyDuplicates bool
	recoverNoCAS, admitAlways, noValidation, tableAcceptsAll           bool
	equalRefused, claimForgetsPosition                                 bool
	claimIgnoresClaimant, writeTakesFence, overlapApplied              bool
}

func (m *mutant) Claim(ctx context.Context, k fence.Key, t fence.Token, claimant string) (fence.State, error) {
	st, err := m.Store.Claim(ctx, k, t, claimant)
	var se *fence.StaleError
	if m.claimIgnoresClaimant && errors.As(err, &se) && se.Stored == t {
		held, _ := m.Store.Load(ctx, k)
		st, err = m.Store.Claim(ctx, k, t, held.Claimant) // as if the equal token were ours
	}
	if m.claimForgetsPosition && err == nil {
		st.Position = fence.NoPosition
	}
	if m.claimIgnoresToken && errors.Is(err, fence.ErrStale) {
		return m.Store.Load(ctx, k)
	}
	if m.noValidation && errors.Is(err, fence.ErrInvalid) {
		return fence.State{Token: t, Position: fence.NoPosition}, nil
	}
	return st, err
}

func (m *mutant) Load(ctx context.Context, k fence.Key) (fence.State, error) {
	st, err := m.Store.Load(ctx, k)
	if m.noValidation && errors.Is(err, fence.ErrInvalid) {
		return fence.State{Position: fence.NoPosition}, nil
	}
	return st, err
}

func (m *mutant) Apply(ctx context.Context, k fence.Key, t fence.Token, first, pos int64, fn func(context.Context, *memfence.Tx) error) error {
	if m.applyIgnoresToken {
		if st, err := m.Store.Load(ctx, k); err == nil && t.Compare(st.Token) < 0 {
			t = st.Token // writes as if it held the stored token
		}
	}
	if m.equalRefused {
		if st, err := m.Store.Load(ctx, k); err == nil && st.Position != fence.NoPosition && t == st.Token {
			return &fence.StaleError{Key: k, Stored: st.Token, Presented: t}
		}
	}
	if m.notAtomic {
		if err := m.Store.Apply(ctx, k, t, first, pos, nil); err != nil {
			return err
		}
		return m.Store.Apply(ctx, fence.Key{Group: "side", Topic: "side", Partition: 0}, fence.Token{}, first, pos, fn)
	}
	if m.writeTakesFence {
		if st, err := m.Store.Load(ctx, k); err == nil && st.Token.Compare(t) < 0 && t.Era == st.Token.Era {
			_, _ = m.Store.Claim(ctx, k, t, "mutant")
		}
	}
	if m.overlapApplied {
		if st, err := m.Store.Load(ctx, k); err == nil && first <= st.Position && st.Position < pos {
			first = st.Position + 1
		}
	}
	err := m.Store.Apply(ctx, k, t, first, pos, fn)
	if m.reapplyDuplicates && errors.Is(err, fence.ErrDuplicate) {
		tx, _ := m.Store.Begin(ctx)
		if err := fn(ctx, tx); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}
	if m.noValidation && errors.Is(err, fence.ErrInvalid) {
		tx, _ := m.Store.Begin(ctx)
		if err := fn(ctx, tx); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}
	return err
}

func (m *mutant) Recover(ctx context.Context, k fence.Key, expected fence.Token, epoch int64, claimant, reason string) (fence.Token, error) {
	if m.recoverNoCAS {
		if st, err := m.Store.Load(ctx, k); err == nil {
			expected = st.Token
		}
	}
	return m.Store.Recover(ctx, k, expected, epoch, claimant, reason)
}

func (m *mutant) Admit(ctx context.Context, tx *memfence.Tx, scope, id string, t fence.Token, seq int64) (fence.Verdict, error) {
	v, err := m.Store.Admit(ctx, tx, scope, id, t, seq)
	if m.admitAlways && err == nil {
		return fence.Admitted, nil
	}
	return v, err
}
