// Package bulk holds what the fence stores' set-based write paths (fence/pgfence/pgbulk and
// fence/sqlitefence/sqlitebulk) share: their options, the validation of an upsert, its ON
// CONFLICT clause, and splitting a batch's rows so that no statement names a key twice.
//
// Rows are grouped by their keys' canonical values ([Canonical], then the dialect's
// normalisation of its column types), so that Go values the database holds as one key (7 as
// an int and as an int64) are one key here too. Equalities Go cannot know (a collation,
// numeric text) are not guessed: the packages report a statement that wrote one key twice.
package bulk

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"

	"github.com/batonhq/baton/internal/sqlident"
)

// MaxKeyColumns bounds a conflict target, so that a key fits a comparable array.
const MaxKeyColumns = 4

type keyOf [MaxKeyColumns]any

// blob is a []byte key value, comparable and apart from a string of the same bytes.
type blob string

// Canonical returns the value that stands for v in a key: an integer of any width as an
// int64 (a uint64 beyond its range stays as it is), a []byte as a comparable copy of its
// bytes; anything else unchanged.
func Canonical(v any) any {
	switch x := v.(type) {
	case int:
		return int64(x)
	case int8:
		return int64(x)
	case int16:
		return int64(x)
	case int32:
		return int64(x)
	case uint:
		if uint64(x) <= math.MaxInt64 {
			return int64(x)
		}
	case uint8:
		return int64(x)
	case uint16:
		return int64(x)
	case uint32:
		return int64(x)
	case uint64:
		if x <= math.MaxInt64 {
			return int64(x)
		}
	case []byte:
		return blob(x)
	}
	return v
}

// BytesAsString returns the canonical value of a []byte as a string of its bytes, for a
// dialect that stores both as one value; v otherwise.
func BytesAsString(v any) any {
	if b, ok := v.(blob); ok {
		return string(b)
	}
	return v
}

// A Norm maps a key column's canonical value to the value that stands for it in the
// dialect, given the column's declared type; nil keeps the canonical value.
type Norm func(v any) any

func keyOfRow(key []int, norm []Norm, row []any) keyOf {
	var k keyOf
	for j, i := range key {
		v := Canonical(row[i])
		if j < len(norm) && norm[j] != nil {
			v = norm[j](v)
		}
		k[j] = v
	}
	return k
}

// Layers returns groups of rows in which no key (the columns at the indexes key, at most
// MaxKeyColumns, compared by their canonical values normalised by norm, one per key column)
// appears twice, to be written in order: with merge, one group in which each key's rows are
// folded into a copy of its first row by merge(into, row) in order; without, the n-th rows
// of every key in the n-th group. A key's first row is copied only when a later row is merged
// into it: rows are never modified.
func Layers(rows [][]any, key []int, norm []Norm, merge func(into, row []any)) [][][]any {
	if len(rows) == 0 {
		return nil
	}
	if len(key) == 1 {
		// One key column (the common case): the map is keyed by the value itself, a
		// quarter of a keyOf's size and hashed once.
		i := key[0]
		var n Norm
		if len(norm) > 0 {
			n = norm[0]
		}
		return layers(rows, merge, func(row []any) any {
			v := Canonical(row[i])
			if n != nil {
				v = n(v)
			}
			return v
		})
	}
	return layers(rows, merge, func(row []any) keyOf { return keyOfRow(key, norm, row) })
}

func layers[K comparable](rows [][]any, merge func(into, row []any), keyOf func([]any) K) [][][]any {
	if merge != nil {
		at := make(map[K]int)
		merged := make([][]any, 0, len(rows))
		var copied []bool // copied[i]: merged[i] is a copy of the key's first row, for merge to change
		for _, r := range rows {
			k := keyOf(r)
			if i, ok := at[k]; ok {
				if !copied[i] {
					merged[i], copied[i] = slices.Clone(merged[i]), true
				}
				merge(merged[i], r)
				continue
			}
			at[k] = len(merged)
			merged = append(merged, r)
			copied = append(copied, false)
		}
		return [][][]any{merged}
	}
	seen := make(map[K]int)
	var layers [][][]any
	for _, r := range rows {
		k := keyOf(r)
		n := seen[k]
		seen[k] = n + 1
		if n == len(layers) {
			layers = append(layers, nil)
		}
		layers[n] = append(layers[n], r)
	}
	return layers
}

// Check validates what both upserts share, naming pkg in every error: the table (schema
// qualification allowed), the column names (valid, unqualified, each listed once) and the
// conflict target (1 to MaxKeyColumns columns, all among names). It returns the key columns'
// indexes in names and every problem found.
func Check(pkg, table string, names, key []string) (keyIdx []int, errs []error) {
	if err := sqlident.Validate(table); err != nil {
		errs = append(errs, fmt.Errorf("%s: table: %w", pkg, err))
	}
	if len(names) == 0 {
		errs = append(errs, fmt.Errorf("%s: no columns", pkg))
	}
	seen := map[string]int{}
	for i, n := range names {
		if err := sqlident.Validate(n); err != nil || strings.Contains(n, ".") {
			errs = append(errs, fmt.Errorf("%s: column %d: invalid name %q", pkg, i, n))
		}
		if _, dup := seen[n]; dup {
			errs = append(errs, fmt.Errorf("%s: column %q listed twice", pkg, n))
		}
		seen[n] = i
	}
	switch {
	case len(key) == 0:
		errs = append(errs, fmt.Errorf("%s: no key columns", pkg))
	case len(key) > MaxKeyColumns:
		errs = append(errs, fmt.Errorf("%s: %d key columns, at most %d", pkg, len(key), MaxKeyColumns))
	}
	for _, k := range key {
		i, ok := seen[k]
		if !ok {
			errs = append(errs, fmt.Errorf("%s: key column %q is not among the columns", pkg, k))
			continue
		}
		keyIdx = append(keyIdx, i)
	}
	return keyIdx, errs
}

// Config is what an upsert's options set.
type Config struct {
	Merge   func(into, row []any)
	Rows    int
	RowsSet bool // Rows given by the RowsPerStatement option
}

// MergeOption is the Merge option of package pkg.
func MergeOption(pkg string, merge func(into, row []any)) func(*Config) error {
	return func(c *Config) error {
		if merge == nil {
			return fmt.Errorf("%s: Merge: nil function", pkg)
		}
		c.Merge = merge
		return nil
	}
}

// RowsOption is the RowsPerStatement option of package pkg.
func RowsOption(pkg string, n int) func(*Config) error {
	return func(c *Config) error {
		if n < 1 {
			return fmt.Errorf("%s: RowsPerStatement(%d): want at least 1", pkg, n)
		}
		c.Rows, c.RowsSet = n, true
		return nil
	}
}

var typePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_ ]*(\([0-9, ]+\))?$`)

// Column is an upsert's column: its name and the type its values are cast to ("" for none,
// where the dialect allows it).
type Column struct{ Name, Type string }

// Columns converts a package's own column type to Column.
func Columns[C ~struct{ Name, Type string }](cols []C) []Column {
	out := make([]Column, len(cols))
	for i, c := range cols {
		out[i] = Column(c)
	}
	return out
}

// Spec is a validated upsert.
type Spec struct {
	Key   []int    // indexes of the key columns
	Norm  []Norm   // per key column, the dialect's normalisation of its values
	Cfg   Config   // the options applied over the defaults
	Names []string // the column names, quoted
}

// New validates an upsert of cols into table with conflict target key and applies opts over
// rows per statement, naming pkg in every error: what [Check] checks, each column's type
// (required unless untyped is allowed) and the options. norm gives each key column's
// normalisation from its declaration (nil: none). It returns every problem found.
func New[O ~func(*Config) error](pkg, table string, key []string, cols []Column, untyped bool, rows int, norm func(Column) Norm, opts []O) (Spec, []error) {
	names := make([]string, len(cols))
	for i, c := range cols {
		names[i] = c.Name
	}
	s := Spec{Cfg: Config{Rows: rows}, Names: make([]string, len(cols))}
	for i, c := range cols {
		s.Names[i] = sqlident.Quote(c.Name)
	}
	var errs []error
	s.Key, errs = Check(pkg, table, names, key)
	if norm != nil {
		for _, i := range s.Key {
			s.Norm = append(s.Norm, norm(cols[i]))
		}
	}
	for _, c := range cols {
		if (c.Type != "" || !untyped) && !typePattern.MatchString(c.Type) {
			errs = append(errs, fmt.Errorf("%s: column %q: invalid type %q", pkg, c.Name, c.Type))
		}
	}
	for i, o := range opts {
		if o == nil {
			errs = append(errs, fmt.Errorf("%s: option %d is nil", pkg, i))
			continue
		}
		if err := o(&s.Cfg); err != nil {
			errs = append(errs, err)
		}
	}
	return s, errs
}

// OnConflict returns the ON CONFLICT clause on the key columns: DO UPDATE SET set, or, for an
// empty set, every non-key column taking the new row's value (DO NOTHING when there is none).
func (s Spec) OnConflict(key []string, set string) string {
	keys := make([]string, len(key))
	for i, k := range key {
		keys[i] = sqlident.Quote(k)
	}
	action := "DO NOTHING"
	if set != "" {
		action = "DO UPDATE SET " + set
	} else {
		var sets []string
		for i, n := range s.Names {
			if !slices.Contains(s.Key, i) {
				sets = append(sets, fmt.Sprintf("%s = excluded.%s", n, n))
			}
		}
		if len(sets) > 0 {
			action = "DO UPDATE SET " + strings.Join(sets, ", ")
		}
	}
	return fmt.Sprintf("ON CONFLICT (%s) %s", strings.Join(keys, ", "), action)
}

// Layers is [Layers] of rows with the spec's key and merge, after checking that every row
// has n values; pkg names the package in the error.
func (s Spec) Layers(pkg string, rows [][]any, n int) ([][][]any, error) {
	for i, r := range rows {
		if len(r) != n {
			return nil, fmt.Errorf("%s: row %d has %d values, want %d", pkg, i, len(r), n)
		}
	}
	return Layers(rows, s.Key, s.Norm, s.Cfg.Merge), nil
}
