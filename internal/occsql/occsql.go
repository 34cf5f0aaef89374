package occsql

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/sqlident"
)

// Dialect is what differs between the stores' drivers.
type Dialect struct {
	What        string           // the store's name, prefixing errors
	Placeholder func(int) string // the placeholder of argument i (1-based)
	NoRows      error            // the driver's error for a query that returned no row
	Wrap        func(error) error
}

// Table is a validated versioned table: its names as configured and as quoted for SQL.
type Table struct {
	d                     Dialect
	name, key, version    string
	qName, qKey, qVersion string
}

// Open validates the table and its columns with [New] and returns it for the store's dialect.
func Open(d Dialect, table, key, version string) (Table, error) {
	t, err := New(d.What, table, key, version)
	if err != nil {
		return Table{}, err
	}
	t.d = d
	return t, nil
}

// New validates the table ("name" or "schema.name") and its key and version columns (one part
// each, different from each other). Every problem is reported, joined, each wrapping
// fence.ErrInvalid; what prefixes the messages (the store's name).
func New(what, table, key, version string) (Table, error) {
	var errs []error
	if err := sqlident.Validate(table); err != nil {
		errs = append(errs, fmt.Errorf("%w: %s: versioned table: %w", fence.ErrInvalid, what, err))
	}
	for _, c := range []struct{ role, name string }{{"key column", key}, {"version column", version}} {
		if err := validColumn(c.name); err != nil {
			errs = append(errs, fmt.Errorf("%w: %s: %s: %w", fence.ErrInvalid, what, c.role, err))
		}
	}
	if key == version {
		errs = append(errs, fmt.Errorf("%w: %s: the key and version columns must differ (both %q)", fence.ErrInvalid, what, key))
	}
	if err := errors.Join(errs...); err != nil {
		return Table{}, err
	}
	return Table{
		name: table, key: key, version: version,
		qName: sqlident.Quote(table), qKey: sqlident.Quote(key), qVersion: sqlident.Quote(version),
	}, nil
}

// validColumn accepts one identifier part: a column name cannot be schema-qualified.
func validColumn(name string) error {
	if strings.Contains(name, ".") {
		return fmt.Errorf("%w: column %q: a column name has one part", sqlident.ErrInvalid, name)
	}
	return sqlident.Validate(name)
}

// Name returns the table's name as configured.
func (t Table) Name() string { return t.name }

// Check validates a write's arguments: a non-nil id, a non-negative expected version, at
// least one column, each a valid name, named once, and neither the key nor the version
// column. Every problem is reported, joined, each wrapping fence.ErrInvalid.
func (t Table) Check(id any, expected int64, set []fence.Column) error {
	var errs []error
	if id == nil {
		errs = append(errs, fmt.Errorf("%w: versioned write to %s: nil id", fence.ErrInvalid, t.name))
	}
	if expected < 0 {
		errs = append(errs, fmt.Errorf("%w: versioned write to %s: expected version %d is negative", fence.ErrInvalid, t.name, expected))
	}
	if len(set) == 0 {
		errs = append(errs, fmt.Errorf("%w: versioned write to %s: no columns to set", fence.ErrInvalid, t.name))
	}
	seen := make(map[string]bool, len(set))
	for _, c := range set {
		switch err := validColumn(c.Name); {
		case err != nil:
			errs = append(errs, fmt.Errorf("%w: versioned write to %s: %w", fence.ErrInvalid, t.name, err))
		case c.Name == t.key || c.Name == t.version:
			errs = append(errs, fmt.Errorf("%w: versioned write to %s: column %q is the key or the version column, which the write owns", fence.ErrInvalid, t.name, c.Name))
		case seen[c.Name]:
			errs = append(errs, fmt.Errorf("%w: versioned write to %s: column %q is set twice", fence.ErrInvalid, t.name, c.Name))
		}
		seen[c.Name] = true
	}
	return errors.Join(errs...)
}

// Insert returns the create statement (expected version 0) and its arguments: the record at
// version 1, or nothing if the key exists (ON CONFLICT on the key column, which must carry a
// unique constraint), returning the version. ph(i) is the store's placeholder for argument i
// (1-based).
func (t Table) Insert(ph func(int) string, id any, set []fence.Column) (string, []any) {
	cols := []string{t.qKey}
	vals := []string{ph(1)}
	args := []any{id}
	for i, c := range set {
		cols = append(cols, sqlident.Quote(c.Name))
		vals = append(vals, ph(i+2))
		args = append(args, c.Value)
	}
	cols = append(cols, t.qVersion)
	vals = append(vals, "1")
	return fmt.Sprintf("INSERT INTO %s (%s) VALUES (%s) ON CONFLICT (%s) DO NOTHING RETURNING %s",
		t.qName, strings.Join(cols, ", "), strings.Join(vals, ", "), t.qKey, t.qVersion), args
}

// Update returns the conditional update and its arguments: the columns set and the version
// raised by one, where the key matches and the version equals expected, in one statement,
// returning the new version.
func (t Table) Update(ph func(int) string, id any, expected int64, set []fence.Column) (string, []any) {
	assign := make([]string, 0, len(set)+1)
	args := []any{id, expected}
	for i, c := range set {
		assign = append(assign, sqlident.Quote(c.Name)+" = "+ph(i+3))
		args = append(args, c.Value)
	}
	assign = append(assign, t.qVersion+" = "+t.qVersion+" + 1")
	return fmt.Sprintf("UPDATE %s SET %s WHERE %s = %s AND %s = %s RETURNING %s",
		t.qName, strings.Join(assign, ", "), t.qKey, ph(1), t.qVersion, ph(2), t.qVersion), args
}

// Select returns the statement that reads a record's version, for classifying a refusal.
func (t Table) Select(ph func(int) string) string {
	return fmt.Sprintf("SELECT %s FROM %s WHERE %s = %s", t.qVersion, t.qName, t.qKey, ph(1))
}

// Conflict returns the error of a refused write; found is 0 if the record does not exist.
func (t Table) Conflict(id any, expected, found int64) error {
	return &fence.VersionConflictError{Table: t.name, ID: id, Expected: expected, Found: found}
}

// conflictRetries bounds the re-runs of a refused write whose re-read found the expected
// version: that happens only when the record was created by a transaction that committed
// after the statement's snapshot, or between the two statements on a querier outside a
// transaction (the write saw no row), and re-running it decides.
const conflictRetries = 3

// Write is fence.Versioned.Write for a table made by [Open]: it checks the arguments, then
// sets the columns of record id if its version is expected and raises the version to
// expected+1 in one statement (expected 0: creates the record at version 1), run with
// queryRow, and returns the new version. A refusal is classified by reading the stored
// version with queryRow: a *fence.VersionConflictError whose Found is that version (0: no
// record). A nil queryRow (the store was given a nil querier) fails with fence.ErrInvalid.
func Write[R interface{ Scan(dest ...any) error }](ctx context.Context, t Table, queryRow func(context.Context, string, ...any) R, id any, expected int64, set []fence.Column) (int64, error) {
	if err := t.Check(id, expected, set); err != nil {
		return 0, err
	}
	if queryRow == nil {
		return 0, fmt.Errorf("%w: %s: versioned write to %s: nil querier", fence.ErrInvalid, t.d.What, t.name)
	}
	ph, wrap := t.d.Placeholder, t.d.Wrap
	if wrap == nil {
		wrap = func(err error) error { return err }
	}
	var query string
	var args []any
	if expected == 0 {
		query, args = t.Insert(ph, id, set)
	} else {
		query, args = t.Update(ph, id, expected, set)
	}
	for attempt := 1; ; attempt++ {
		var version int64
		err := queryRow(ctx, query, args...).Scan(&version)
		if err == nil {
			return version, nil
		}
		if !errors.Is(err, t.d.NoRows) {
			return 0, fmt.Errorf("%s: versioned write to %s: %w", t.d.What, t.name, wrap(err))
		}
		var found int64
		switch err := queryRow(ctx, t.Select(ph), id).Scan(&found); {
		case errors.Is(err, t.d.NoRows):
			found = 0
		case err != nil:
			return 0, fmt.Errorf("%s: versioned write to %s: refused; reading the stored version: %w", t.d.What, t.name, wrap(err))
		}
		if found != expected || attempt == conflictRetries {
			return 0, t.Conflict(id, expected, found)
		}
	}
}
