// Package bulk holds what the fence stores' set-based write paths (fence/pgfence/pgbulk and
// fence/sqlitefence/sqlitebulk) share: splitting a batch's rows so that no statement names a
// key twice.
package bulk

import "slices"

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
