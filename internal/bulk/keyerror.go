package bulk

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/batonhq/baton/internal/sqlident"
)

// KeyError reports a statement that wrote one database key twice: two of its rows had keys
// that differ as Go values (so neither merged nor layered) but are equal in the database.
// Retrying cannot fix it, so it is permanent (Permanent, which the consumer's IsPermanent
// reads: the batch is applied one record at a time, a record that alone still fails is
// dead-lettered with this error as the reason).
type KeyError struct {
	Pkg    string   // the package reporting it
	Table  string   // the table, as given
	Cols   []string // the key's columns
	Stored string   // the key as the database stored it, if it said (SQL literals)
	Likely [][]any  // else, if found, two keys of the statement that are likely one
	Rows   int      // the statement's rows
	Err    error    // the database's own error, if any
}

func (e *KeyError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: upsert into %s: two of one statement's %d rows have one key (%s) in the database though their Go values differ",
		e.Pkg, sqlident.Quote(e.Table), e.Rows, strings.Join(e.Cols, ", "))
	switch {
	case e.Stored != "":
		b.WriteString(": ")
		b.WriteString(e.Stored)
	case len(e.Likely) > 0:
		keys := make([]string, len(e.Likely))
		for i, k := range e.Likely {
			keys[i] = FormatKey(k)
		}
		b.WriteString(", likely ")
		b.WriteString(strings.Join(keys, " and "))
	}
	b.WriteString("; give each database key one Go value")
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap returns the database's error, if any.
func (e *KeyError) Unwrap() error { return e.Err }

// Permanent reports that retrying cannot fix the statement.
func (e *KeyError) Permanent() bool { return true }

// FormatKey formats a key's values as a tuple: strings quoted.
func FormatKey(k []any) string {
	parts := make([]string, len(k))
	for i, v := range k {
		switch x := v.(type) {
		case string:
			parts[i] = strconv.Quote(x)
		case []byte:
			parts[i] = fmt.Sprintf("%x", x)
		default:
			parts[i] = fmt.Sprint(x)
		}
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// LikelyPair returns two keys of rows that are probably one key in the database though Go
// holds them apart (equal after folding case and spacing, reading numbers, converting times
// to UTC), or nil: a hint for the error message only.
func LikelyPair(rows [][]any, key []int) [][]any {
	seen := map[string][]any{}
	for _, r := range rows {
		k := make([]any, len(key))
		folded := make([]string, len(key))
		for j, i := range key {
			k[j] = r[i]
			folded[j] = fold(r[i])
		}
		f := strings.Join(folded, "\x00")
		if first, ok := seen[f]; ok {
			return [][]any{first, k}
		}
		seen[f] = k
	}
	return nil
}

func fold(v any) string {
	switch x := Canonical(v).(type) {
	case time.Time:
		return x.UTC().String()
	case blob:
		v = string(x)
	}
	s := strings.ToLower(strings.TrimSpace(fmt.Sprint(v)))
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		return strconv.FormatFloat(f, 'g', -1, 64)
	}
	return s
}
