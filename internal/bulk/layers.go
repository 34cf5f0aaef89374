// Package bulk holds what the fence stores' set-based write paths (fence/pgfence/pgbulk and
// fence/sqlitefence/sqlitebulk) share: splitting a batch's rows so that no statement names a
// key twice.
package bulk

import (
	"fmt"
	"slices"
	"strings"

	"github.com/batonhq/baton/internal/sqlident"
)

// MaxKeyColumns bounds a conflict target, so that a key fits a comparable array.
const MaxKeyColumns = 4

type keyOf [MaxKeyColumns]any

func keyOfRow(key []int, row []any) keyOf {
	var k keyOf
	for j, i := range key {
		v := row[i]
		if bs, ok := v.([]byte); ok { // not comparable
			v = string(bs)
		}
		k[j] = v
	}
	return k
}

// Layers returns groups of rows in which no key (the columns at the indexes key, at most
// MaxKeyColumns) appears twice, to be written in order: with merge, one group in which each
// key's rows are folded into a copy of its first row by merge(into, row) in order; without,
// the n-th rows of every key in the n-th group.
func Layers(rows [][]any, key []int, merge func(into, row []any)) [][][]any {
	if len(rows) == 0 {
		return nil
	}
	if merge != nil {
		at := make(map[keyOf]int, len(rows))
		merged := make([][]any, 0, len(rows))
		for _, r := range rows {
			k := keyOfRow(key, r)
			if i, ok := at[k]; ok {
				merge(merged[i], r)
				continue
			}
			at[k] = len(merged)
			merged = append(merged, slices.Clone(r))
		}
		return [][][]any{merged}
	}
	seen := make(map[keyOf]int, len(rows))
	var layers [][][]any
	for _, r := range rows {
		k := keyOfRow(key, r)
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
