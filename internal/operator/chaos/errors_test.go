package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/fence/sqlitefence"
)

func TestCauseOf(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("sqlitefence: %w while waiting for the write lock", context.Canceled), CauseCanceled},
		// A revoke that cut a busy wait short is the revoke's doing.
		{fmt.Errorf("sqlitefence: %w while waiting for the write lock: %w", context.Canceled, sqlitefence.ErrBusy), CauseCanceled},
		{fmt.Errorf("apply: %w", context.DeadlineExceeded), CauseDeadline},
		{fmt.Errorf("apply: %w", sqlitefence.ErrBusy), CauseSQLiteBusy},
		{fmt.Errorf("commit: %w", &pgconn.PgError{Code: "25P03", Message: "terminating connection due to idle-in-transaction timeout"}), "postgres 25P03"},
		{fmt.Errorf("apply: %w", &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}), CauseNetwork},
		{fmt.Errorf("claim: %w", &fence.RegressionError{}), CauseRegression},
		{fmt.Errorf("recover: %w", fence.ErrConflict), CauseConflict},
		{fmt.Errorf("%w: empty topic", fence.ErrInvalid), CauseInvalid},
		{fmt.Errorf("%w: offset 7", errBadRecord), CauseBadRecord},
		{errors.New("something else"), CauseOther},
	} {
		if got := causeOf(tc.err); got != tc.want {
			t.Errorf("causeOf(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

// TestVerdictNamesErrors: the attempts that failed with an error reach the verdict grouped by
// cause, with counts and one example message each, and the report prints them under the
// error count.
func TestVerdictNamesErrors(t *testing.T) {
	ctx := context.Background()
	store, err := sqlitefence.Open(filepath.Join(t.TempDir(), "v.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	db := SQLDB(store.DB())
	if err := Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	tok := fence.Token{Epoch: 2}
	logResult(ctx, db, "w1", "t", 0, tok, -1, 10, false, false, nil)
	logResult(ctx, db, "w1", "t", 0, tok, -1, 11, false, false, fmt.Errorf("sqlitefence: %w while waiting for the write lock", context.Canceled))
	logResult(ctx, db, "w2", "t", 1, tok, -1, 12, false, false, context.Canceled)
	logResult(ctx, db, "w2", "t", 1, tok, -1, 13, false, false, fmt.Errorf("commit: %w", &pgconn.PgError{Severity: "FATAL", Code: "57P01", Message: "terminating connection due to administrator command"}))
	logResult(ctx, db, "w3", "t", 2, tok, -1, 14, true, false, fmt.Errorf("apply: %w", fence.ErrStale))
	logAttempt(ctx, db, "w3", "t", 2, tok, -1, 14, OutcomeFrozen, false, "freezing before the write")
	logResult(ctx, db, "w3", "t", 2, tok, -1, 15, false, false, fmt.Errorf("timeout record: %w", ErrNotDue)) // not an attempt: not logged

	v, err := Check(ctx, db, Workload{Keys: 1, PerKey: 1})
	if err != nil {
		t.Fatal(err)
	}
	want := []ErrorGroup{
		{Cause: CauseCanceled, Count: 2, Example: "sqlitefence: context canceled while waiting for the write lock"},
		{Cause: "postgres 57P01", Count: 1, Example: "commit: FATAL: terminating connection due to administrator command (SQLSTATE 57P01)"},
	}
	if fmt.Sprint(v.Errors) != fmt.Sprint(want) {
		t.Errorf("errors:\n%+v\nwant\n%+v", v.Errors, want)
	}
	if v.Attempts[OutcomeError] != 3 || v.Attempts[OutcomeStale] != 1 || v.Attempts[OutcomeCommitted] != 1 {
		t.Errorf("attempts by outcome: %v", v.Attempts)
	}

	var b strings.Builder
	WriteVerdict(&b, &Result{Verdict: v, Started: time.Now(), Finished: time.Now()})
	out := b.String()
	for _, re := range []string{
		`(?m)^write attempts: error\s+3$`,
		`(?m)^  error: canceled\s+2  the write's context ended: its partition was revoked .*; e\.g\. "sqlitefence: context canceled while waiting for the write lock"$`,
		`(?m)^  error: postgres 57P01\s+1  PostgreSQL was shutting down or restarting; e\.g\. "commit: FATAL: terminating connection`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("verdict lacks %s:\n%s", re, out)
		}
	}
	if strings.Index(out, "write attempts: error") > strings.Index(out, "  error: canceled") {
		t.Errorf("the error causes are not listed under the error count:\n%s", out)
	}
}

func TestClip(t *testing.T) {
	if got := clip("short", 10); got != "short" {
		t.Errorf("clip short = %q", got)
	}
	if got := clip("ééé", 3); got != "é…" {
		t.Errorf("clip at a rune boundary = %q, want %q", got, "é…")
	}
}
