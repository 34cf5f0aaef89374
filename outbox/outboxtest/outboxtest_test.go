package outboxtest_test

import (
	"context"
	"database/sql"
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
	"github.com/batonhq/baton/outbox"
	"github.com/batonhq/baton/outbox/outboxtest"
	"github.com/batonhq/baton/outbox/sqliteoutbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// sqliteEnv is sqliteoutbox over a sqlitefence file, the store the mutants wrap.
func sqliteEnv(t *testing.T) (outboxtest.Env[*sql.Tx], *sqliteoutbox.Store, *sql.DB) {
	fences, err := sqlitefence.Open(filepath.Join(t.TempDir(), "outbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fences.Close() })
	store, err := sqliteoutbox.New(fences)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	db := fences.DB()
	return outboxtest.Env[*sql.Tx]{
		Store:  store,
		Fences: fences,
		Begin: func(ctx context.Context) (*sql.Tx, func() error, func() error, error) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return nil, nil, nil, err
			}
			return tx, tx.Commit, tx.Rollback, nil
		},
	}, store, db
}

func TestSuite(t *testing.T) {
	outboxtest.Run(t, func(t *testing.T) outboxtest.Env[*sql.Tx] {
		env, _, _ := sqliteEnv(t)
		return env
	})
}

// mutants are broken stores, each with the cases that must catch it. TestMutants runs the suite
// against each in a child process and checks that those cases fail.
var mutants = map[string]struct {
	m     mutant
	catch []string
}{
	"AppendAcceptsStaleToken":   {mutant{appendStale: true}, []string{"AppendStaleRefused"}},
	"AppendAcceptsUnfenced":     {mutant{appendUnfenced: true}, []string{"AppendNeedsExactToken", "AppendUnfenced"}},
	"SequenceGaps":              {mutant{gaps: true}, []string{"SequencesGapFreeConcurrent", "RolledBackAppendLeavesNoGap", "CleanupNeverReusesSequences"}},
	"CleanupReusesSequences":    {mutant{cleanupResets: true}, []string{"CleanupNeverReusesSequences"}},
	"CleanupDeletesUndelivered": {mutant{cleanupAll: true}, []string{"CleanupNeverReusesSequences"}},
	"PendingWhenStale":          {mutant{pendingStale: true}, []string{"RelayFenced"}},
	"MarksWhenStale":            {mutant{markStale: true}, []string{"RelayFenced"}},
	"MarksUnfenced":             {mutant{markUnfenced: true}, []string{"RelayFenced"}},
	"NoValidation":              {mutant{noValidation: true}, []string{"BadInputRefusedBeforeAnyStatement"}},
	"DeadLetterWhenStale":       {mutant{deadStale: true}, []string{"DeadLetterFenced"}},
	"DeadLetterUnfenced":        {mutant{deadUnfenced: true}, []string{"DeadLetterFenced"}},
	"DeadLetterAnyRow":          {mutant{deadAnyRow: true}, []string{"DeadLetterFenced"}},
	"DeadLetterLeavesPending":   {mutant{deadPending: true}, []string{"DeadLetterFenced", "DeadLetteredRowsSkippedNeverReused"}},
	"DeadLetterReusesSequence":  {mutant{deadReuses: true}, []string{"DeadLetteredRowsSkippedNeverReused"}},
}

const mutantEnv = "OUTBOXTEST_MUTANT"

// TestMutant runs the suite against the mutant named by $OUTBOXTEST_MUTANT; it is the child
// process of TestMutants and is skipped otherwise.
func TestMutant(t *testing.T) {
	name := os.Getenv(mutantEnv)
	if name == "" {
		t.Skip("run by TestMutants")
	}
	outboxtest.Run(t, func(t *testing.T) outboxtest.Env[*sql.Tx] {
		env, store, db := sqliteEnv(t)
		m := mutants[name].m
		m.Store, m.db = store, db
		env.Store = &m
		return env
	})
}

func TestMutants(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	for name, mu := range mutants {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestMutant$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), mutantEnv+"="+name)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed against the broken store %s", name)
			}
			if ctx.Err() != nil {
				t.Fatalf("the suite hung on %s instead of failing", name)
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

// mutant is sqliteoutbox with one rule broken.
type mutant struct {
	*sqliteoutbox.Store
	db *sql.DB

	appendStale, appendUnfenced, gaps, cleanupResets, cleanupAll bool
	pendingStale, markStale, markUnfenced, noValidation          bool
	deadStale, deadUnfenced, deadAnyRow, deadPending, deadReuses bool
}

const cursors = "baton_outbox_cursors" // the default table's cursors

func (m *mutant) Append(ctx context.Context, tx *sql.Tx, src fence.Key, tok fence.Token, msgs ...outbox.Message) error {
	err := m.Store.Append(ctx, tx, src, tok, msgs...)
	var se *fence.StaleError
	switch {
	case m.appendStale && errors.As(err, &se):
		return m.Store.Append(ctx, tx, src, se.Stored, msgs...) // writes as if it held the stored token
	case m.appendUnfenced && errors.Is(err, outbox.ErrUnfenced):
		return nil
	case m.gaps && err == nil:
		_, err = tx.ExecContext(ctx, `UPDATE `+cursors+` SET last_seq = last_seq + 1 WHERE grp = ? AND topic = ? AND partition = ?`,
			src.Group, src.Topic, src.Partition)
		return err
	case m.noValidation && err != nil && !errors.Is(err, outbox.ErrUnfenced) && !errors.Is(err, fence.ErrStale):
		fixed := make([]outbox.Message, len(msgs))
		for i := range msgs {
			fixed[i] = outbox.Message{Topic: "dest", Key: msgs[i].Key}
		}
		return m.Store.Append(ctx, tx, src, tok, fixed...)
	}
	return err
}

func (m *mutant) Pending(ctx context.Context, src fence.Key, tok fence.Token, limit int) ([]outbox.Row, error) {
	rows, err := m.Store.Pending(ctx, src, tok, limit)
	if se := (*fence.StaleError)(nil); m.pendingStale && errors.As(err, &se) {
		return m.Store.Pending(ctx, src, se.Stored, limit)
	}
	return rows, err
}

func (m *mutant) MarkDelivered(ctx context.Context, src fence.Key, tok fence.Token, through int64) (int64, error) {
	n, err := m.Store.MarkDelivered(ctx, src, tok, through)
	if se := (*fence.StaleError)(nil); m.markStale && errors.As(err, &se) {
		return m.Store.MarkDelivered(ctx, src, se.Stored, through)
	}
	if m.markUnfenced && errors.Is(err, outbox.ErrUnfenced) {
		return 0, nil
	}
	return n, err
}

func (m *mutant) Cleanup(ctx context.Context, olderThan time.Duration) (int64, error) {
	if m.cleanupAll && olderThan >= 0 {
		res, err := m.db.ExecContext(ctx, `DELETE FROM baton_outbox`)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	}
	n, err := m.Store.Cleanup(ctx, olderThan)
	if m.cleanupResets && err == nil {
		_, err = m.db.ExecContext(ctx, `DELETE FROM `+cursors+` WHERE delivered_seq = last_seq`)
	}
	return n, err
}

func (m *mutant) DeadLetter(ctx context.Context, src fence.Key, tok fence.Token, seq int64, reason string) (int64, error) {
	n, err := m.Store.DeadLetter(ctx, src, tok, seq, reason)
	var se *fence.StaleError
	switch {
	case m.deadStale && errors.As(err, &se):
		return m.Store.DeadLetter(ctx, src, se.Stored, seq, reason)
	case m.deadUnfenced && errors.Is(err, outbox.ErrUnfenced):
		return 0, nil
	case m.deadAnyRow && errors.Is(err, outbox.ErrInvalid) && seq > 1:
		if _, err := m.Store.MarkDelivered(ctx, src, tok, seq-1); err != nil {
			return 0, err
		}
		return m.Store.DeadLetter(ctx, src, tok, seq, reason)
	case m.deadPending && err == nil:
		_, err = m.db.ExecContext(ctx, `UPDATE `+cursors+` SET delivered_seq = delivered_seq - 1 WHERE grp = ? AND topic = ? AND partition = ?`,
			src.Group, src.Topic, src.Partition)
		return n + 1, err
	case m.deadReuses && err == nil:
		if _, err := m.db.ExecContext(ctx, `DELETE FROM baton_outbox WHERE grp = ? AND topic = ? AND partition = ? AND seq = ?`,
			src.Group, src.Topic, src.Partition, seq); err != nil {
			return 0, err
		}
		_, err = m.db.ExecContext(ctx, `UPDATE `+cursors+` SET last_seq = last_seq - 1, delivered_seq = delivered_seq - 1
			WHERE grp = ? AND topic = ? AND partition = ? AND last_seq = ?`, src.Group, src.Topic, src.Partition, seq)
		return n, err
	}
	return n, err
}
