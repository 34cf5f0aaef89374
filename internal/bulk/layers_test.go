package bulk

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
)

// typed formats values with their Go types: int(7) int64(7).
func typed(vs []any) string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = fmt.Sprintf("%T(%v)", v, v)
	}
	return strings.Join(out, " ")
}

// TestLayersKeysByCanonicalValue: one integer in every width is one key, merged or layered;
// values Canonical keeps apart stay apart.
func TestLayersKeysByCanonicalValue(t *testing.T) {
	one := []any{int(7), int8(7), int16(7), int32(7), int64(7), uint(7), uint8(7), uint16(7), uint32(7), uint64(7)}
	var rows [][]any
	for i, k := range one {
		rows = append(rows, []any{k, i})
	}
	merges := 0
	merged := Layers(rows, []int{0}, nil, func(into, row []any) { merges++; into[1] = row[1] })
	if len(merged) != 1 || len(merged[0]) != 1 || merges != len(one)-1 {
		t.Errorf("keys %s held as different keys: merged into %d rows, merge called %d times", typed(one), len(merged[0]), merges)
	}
	if layers := Layers(rows, []int{0}, nil, nil); len(layers) != len(one) {
		t.Errorf("keys %s held as different keys: %d layers, want %d", typed(one), len(layers), len(one))
	}
	for _, apart := range [][]any{
		{int64(7), uint64(math.MaxUint64)},
		{int64(7), 7.0},
		{"a", []byte("a")},
		{"7", int64(7)},
	} {
		rows := [][]any{{apart[0]}, {apart[1]}}
		if layers := Layers(rows, []int{0}, nil, nil); len(layers) != 1 || len(layers[0]) != 2 {
			t.Errorf("keys %s taken for one key", typed(apart))
		}
	}
	// A dialect that stores bytes and text alike says so with its Norm.
	rows = [][]any{{"a", 1}, {[]byte("a"), 2}}
	if layers := Layers(rows, []int{0}, []Norm{BytesAsString}, nil); len(layers) != 2 {
		t.Errorf(`"a" and []byte("a") under BytesAsString: %d layers, want 2`, len(layers))
	}
}

func TestKeyErrorIsPermanentAndNamesTheKey(t *testing.T) {
	cause := errors.New("cause")
	err := error(&KeyError{Pkg: "p", Table: "app.t", Cols: []string{"a", "b"}, Rows: 3,
		Likely: LikelyPair([][]any{{"x", int32(1), 0}, {"Seven", 1, 0}, {" seven", int64(1), 0}}, []int{0, 1}), Err: cause})
	var p interface{ Permanent() bool }
	if !errors.Is(err, cause) || !errors.As(err, &p) || !p.Permanent() {
		t.Errorf("%v: want permanent, wrapping the cause", err)
	}
	for _, want := range []string{`"app"."t"`, "(a, b)", `likely ("Seven", 1) and (" seven", 1)`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v: want %s", err, want)
		}
	}
}

// BenchmarkLayers measures the split of a batch as the fold of 'baton bench' makes it: 1000
// rows of six values over 83 string keys (a partition's share of 1000 keys in 12
// partitions), merged per key and in layers. Read its allocs/op and B/op.
//
//	go test -run '^$' -bench Layers -benchmem ./internal/bulk/
func BenchmarkLayers(b *testing.B) {
	rows := make([][]any, 1000)
	for i := range rows {
		v := int64(i/83 + 1)
		rows[i] = []any{fmt.Sprintf("k%05d", i%83*12), int64(1), v, v, v, int64(0)}
	}
	merge := func(into, row []any) {
		into[1] = into[1].(int64) + row[1].(int64)
		into[4] = row[4]
	}
	norm := []Norm{BytesAsString} // what pgbulk's normalisation does to a string key
	b.Run("merged", func(b *testing.B) {
		for b.Loop() {
			if l := Layers(rows, []int{0}, norm, merge); len(l) != 1 || len(l[0]) != 83 {
				b.Fatalf("%d layers", len(l))
			}
		}
	})
	b.Run("layered", func(b *testing.B) {
		for b.Loop() {
			if l := Layers(rows, []int{0}, norm, nil); len(l) != 13 {
				b.Fatalf("%d layers", len(l))
			}
		}
	})
}

// TestLayersMergeLeavesRowsAlone: merging folds into copies, by one key column and by two,
// and a key's rows arrive merged in order; the caller's rows keep their values.
func TestLayersMergeLeavesRowsAlone(t *testing.T) {
	for _, key := range [][]int{{0}, {0, 1}} {
		rows := [][]any{{"a", 1, int64(1)}, {"b", 1, int64(10)}, {"a", 1, int64(2)}, {"c", 1, int64(5)}, {"a", 1, int64(3)}}
		want := fmt.Sprint(rows)
		merged := Layers(rows, key, nil, func(into, row []any) { into[2] = into[2].(int64)*10 + row[2].(int64) })
		if got := fmt.Sprint(merged); got != "[[[a 1 123] [b 1 10] [c 1 5]]]" {
			t.Errorf("key %v: merged %s, want [[[a 1 123] [b 1 10] [c 1 5]]]", key, got)
		}
		if got := fmt.Sprint(rows); got != want {
			t.Errorf("key %v: the rows changed to %s, were %s", key, got, want)
		}
	}
}
