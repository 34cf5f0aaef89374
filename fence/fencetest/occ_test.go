package fencetest_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/fencetest"
)

// memOCC is the reference in-memory versioned table the OCC suite runs against here: committed
// records, and per-record write locks held by a transaction until it ends, as PostgreSQL's row
// locks are. Its mutant flags each break one rule.
type memOCC struct {
	mu    sync.Mutex
	cond  *sync.Cond
	rows  map[string]memRow
	owner map[string]*memOCCTx
	occMutant
}

type memRow struct {
	value   string
	version int64
}

type memOCCTx struct {
	s      *memOCC
	writes map[string]memRow
}

type occMutant struct {
	ignoresVersion, noIncrement, checkThenWrite, createOverwrites bool
	updateCreatesMissing, conflictWithoutFound, outsideCallerTx   bool
	noValidation, namesAcceptAll                                  bool
}

func newMemOCC() *memOCC {
	s := &memOCC{rows: map[string]memRow{}, owner: map[string]*memOCCTx{}}
	s.cond = sync.NewCond(&s.mu)
	return s
}

var _ fence.Versioned[*memOCCTx] = (*memOCC)(nil)

var occName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

func (s *memOCC) validate(id any, expected int64, set []fence.Column) error {
	if _, ok := id.(string); !ok {
		return fmt.Errorf("%w: id %v is not a string", fence.ErrInvalid, id)
	}
	if expected < 0 || len(set) == 0 {
		return fmt.Errorf("%w: expected %d, %d columns", fence.ErrInvalid, expected, len(set))
	}
	seen := map[string]bool{}
	for _, c := range set {
		if !occName.MatchString(c.Name) || c.Name == "id" || c.Name == "version" || seen[c.Name] {
			return fmt.Errorf("%w: column %q", fence.ErrInvalid, c.Name)
		}
		seen[c.Name] = true
	}
	return nil
}

func (s *memOCC) Write(ctx context.Context, tx *memOCCTx, rawID any, expected int64, set ...fence.Column) (int64, error) {
	if !s.noValidation {
		if err := s.validate(rawID, expected, set); err != nil {
			return 0, err
		}
	}
	id := fmt.Sprint(rawID)
	value := ""
	for _, c := range set {
		if c.Name == "value" {
			value = fmt.Sprint(c.Value)
		} else if !s.noValidation {
			return 0, fmt.Errorf("no such column: %s", c.Name)
		}
	}
	if s.checkThenWrite { // the check, then a gap, then the write: two steps, not one
		s.mu.Lock()
		cur, ok := s.rows[id]
		s.mu.Unlock()
		if err := s.compare(id, expected, cur, ok); err != nil {
			return 0, err
		}
		time.Sleep(2 * time.Millisecond)
	}
	stop := context.AfterFunc(ctx, func() { s.mu.Lock(); s.cond.Broadcast(); s.mu.Unlock() })
	defer stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for o := s.owner[id]; o != nil && o != tx; o = s.owner[id] {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		s.cond.Wait()
	}
	cur, ok := tx.writes[id]
	if !ok {
		cur, ok = s.rows[id]
	}
	if !s.checkThenWrite {
		if err := s.compare(id, expected, cur, ok); err != nil {
			return 0, err
		}
	}
	next := memRow{value: value, version: cur.version + 1}
	switch {
	case s.noIncrement && ok:
		next.version = cur.version
	case s.createOverwrites && expected == 0:
		next.version = 1
	case s.updateCreatesMissing && !ok:
		next.version = expected + 1
	}
	if s.outsideCallerTx {
		s.rows[id] = next
		return expected + 1, nil
	}
	s.owner[id] = tx
	tx.writes[id] = next
	return expected + 1, nil
}

// compare is the rule; it runs with s.mu held (or on a copy, for checkThenWrite).
func (s *memOCC) compare(id string, expected int64, cur memRow, ok bool) error {
	found := int64(0)
	if ok {
		found = cur.version
	}
	switch {
	case expected == 0 && !ok, expected == 0 && s.createOverwrites:
		return nil
	case expected > 0 && !ok && s.updateCreatesMissing:
		return nil
	case expected > 0 && ok && (cur.version == expected || s.ignoresVersion):
		return nil
	}
	if s.conflictWithoutFound {
		found = expected
	}
	return &fence.VersionConflictError{Table: "mem", ID: id, Expected: expected, Found: found}
}

func (s *memOCC) begin() *memOCCTx { return &memOCCTx{s: s, writes: map[string]memRow{}} }

func (tx *memOCCTx) end(commit bool) error {
	s := tx.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, r := range tx.writes {
		if commit {
			s.rows[id] = r
		}
		if s.owner[id] == tx {
			delete(s.owner, id)
		}
	}
	tx.writes = map[string]memRow{}
	s.cond.Broadcast()
	return nil
}

func memOCCEnv(m occMutant) func(t *testing.T) fencetest.OCCEnv[*memOCCTx] {
	return func(t *testing.T) fencetest.OCCEnv[*memOCCTx] {
		s := newMemOCC()
		s.occMutant = m
		return fencetest.OCCEnv[*memOCCTx]{
			Versioned: s, Table: "mem", Key: "id", Version: "version",
			Begin: func(ctx context.Context) (*memOCCTx, func() error, func() error, error) {
				tx := s.begin()
				return tx, func() error { return tx.end(true) }, func() error { return tx.end(false) }, nil
			},
			Read: func(ctx context.Context, id string) (string, int64, bool, error) {
				s.mu.Lock()
				defer s.mu.Unlock()
				r, ok := s.rows[id]
				return r.value, r.version, ok, nil
			},
			Names: func(table, key, version string) error {
				if m.namesAcceptAll {
					return nil
				}
				parts := strings.Split(table, ".")
				ok := len(parts) <= 2 && occName.MatchString(key) && occName.MatchString(version) && key != version
				for _, p := range parts {
					ok = ok && occName.MatchString(p)
				}
				if !ok {
					return fence.ErrInvalid
				}
				return nil
			},
		}
	}
}

func TestOCCSuite(t *testing.T) { fencetest.RunOCC(t, memOCCEnv(occMutant{})) }

// occMutants are broken versioned tables, each with the cases that must catch it.
var occMutants = map[string]struct {
	m     occMutant
	catch []string
}{
	"IgnoresVersion": {occMutant{ignoresVersion: true},
		[]string{"OCCStaleVersionRefused", "OCCPausedWriter", "OCCConcurrentUpdatesOneWins", "OCCRecordIsolation", "OCCCallerTransaction"}},
	"NoIncrement": {occMutant{noIncrement: true},
		[]string{"OCCCreateThenUpdate", "OCCPausedWriter", "OCCStaleVersionRefused", "OCCConcurrentUpdatesOneWins"}},
	"CheckThenWrite": {occMutant{checkThenWrite: true},
		[]string{"OCCConcurrentUpdatesOneWins", "OCCConcurrentCreatesOneWins"}},
	"CreateOverwrites": {occMutant{createOverwrites: true},
		[]string{"OCCCreateExisting", "OCCConcurrentCreatesOneWins"}},
	"UpdateCreatesMissing": {occMutant{updateCreatesMissing: true},
		[]string{"OCCMissingRecord"}},
	"ConflictWithoutFound": {occMutant{conflictWithoutFound: true},
		[]string{"OCCCreateExisting", "OCCStaleVersionRefused", "OCCMissingRecord", "OCCPausedWriter",
			"OCCConcurrentUpdatesOneWins", "OCCConcurrentCreatesOneWins", "OCCRecordIsolation", "OCCCallerTransaction"}},
	"OutsideCallerTx": {occMutant{outsideCallerTx: true},
		[]string{"OCCCallerTransaction"}},
	"NoValidation": {occMutant{noValidation: true},
		[]string{"OCCBadInput"}},
	"NamesAcceptAll": {occMutant{namesAcceptAll: true},
		[]string{"OCCNames"}},
}

const occMutantEnv = "FENCETEST_OCC_MUTANT"

// TestOCCMutant runs the OCC suite against the mutant named by $FENCETEST_OCC_MUTANT; it is
// the child process of TestOCCMutants and is skipped otherwise.
func TestOCCMutant(t *testing.T) {
	name := os.Getenv(occMutantEnv)
	if name == "" {
		t.Skip("run by TestOCCMutants")
	}
	fencetest.RunOCC(t, memOCCEnv(occMutants[name].m))
}

func TestOCCMutants(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	for name, mu := range occMutants {
		t.Run(name, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestOCCMutant$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), occMutantEnv+"="+name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the OCC suite passed against the broken table %s", name)
			}
			failed := map[string]bool{}
			for _, m := range regexp.MustCompile(`--- FAIL: TestOCCMutant/(\w+)`).FindAllStringSubmatch(string(out), -1) {
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

// TestOCCConflictError pins the error's text and chain.
func TestOCCConflictError(t *testing.T) {
	for _, c := range []struct {
		e    fence.VersionConflictError
		want string
	}{
		{fence.VersionConflictError{Table: "work_order", ID: 4711, Expected: 12, Found: 13}, "expected version 12, found 13"},
		{fence.VersionConflictError{Table: "work_order", ID: 4711, Expected: 12}, "expected version 12, the record does not exist"},
		{fence.VersionConflictError{Table: "work_order", ID: 4711, Found: 3}, "create refused, the record exists at version 3"},
	} {
		err := fmt.Errorf("wrapped: %w", &c.e)
		var ce *fence.VersionConflictError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "work_order 4711") {
			t.Errorf("%v: want a *fence.VersionConflictError and %q", err, c.want)
		}
	}
}
