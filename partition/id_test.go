package partition

import (
	"errors"
	"strings"
	"testing"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/fencecheck"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestIDStringAndOf(t *testing.T) {
	id := Of(&kgo.Record{Topic: "orders", Partition: 3, Offset: 17})
	if id != (ID{Topic: "orders", Partition: 3}) {
		t.Fatalf("Of = %#v", id)
	}
	if got := id.String(); got != "orders/3" {
		t.Fatalf("String = %q, want orders/3", got)
	}
	if got := id.Key("billing"); got != (fence.Key{Group: "billing", Topic: "orders", Partition: 3}) {
		t.Fatalf("Key = %#v", got)
	}
}

func TestIDValidate(t *testing.T) {
	for _, tc := range []struct {
		id ID
		ok bool
	}{
		{ID{"orders", 0}, true},
		{ID{"orders", 2147483647}, true},
		{ID{"", 0}, false},
		{ID{"orders", -1}, false},
		{ID{"bad\x00topic", 0}, false},
		{ID{"\xff", 0}, false},
		{ID{strings.Repeat("t", fencecheck.MaxIdentifierLen+1), 0}, false},
	} {
		err := tc.id.Validate()
		if tc.ok && err != nil {
			t.Errorf("%q: %v", tc.id, err)
		}
		if !tc.ok && !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%q: err %v, want fence.ErrInvalid", tc.id, err)
		}
	}
}

func TestParseID(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want ID
		ok   bool
	}{
		{"orders/3", ID{"orders", 3}, true},
		{"orders/0", ID{"orders", 0}, true},
		{"a/b/12", ID{"a/b", 12}, true}, // the last '/' separates
		{"orders/2147483647", ID{"orders", 2147483647}, true},
		{"orders/2147483648", ID{}, false},
		{"orders/03", ID{}, false},
		{"orders/-1", ID{}, false},
		{"orders/+1", ID{}, false},
		{"orders/", ID{}, false},
		{"orders", ID{}, false},
		{"/3", ID{}, false},
		{"orders/3 ", ID{}, false},
	} {
		got, err := ParseID(tc.in)
		if tc.ok && (err != nil || got != tc.want) {
			t.Errorf("ParseID(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
		if !tc.ok && !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("ParseID(%q) = %v, %v; want fence.ErrInvalid", tc.in, got, err)
		}
	}
}

func FuzzParseID(f *testing.F) {
	for _, s := range []string{"orders/3", "a/b/0", "x/01", "/", "t/-0", "t/2147483648"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseID(s)
		if err != nil {
			if !errors.Is(err, fence.ErrInvalid) {
				t.Fatalf("ParseID(%q): %v does not wrap fence.ErrInvalid", s, err)
			}
			return
		}
		if err := id.Validate(); err != nil {
			t.Fatalf("ParseID(%q) returned an invalid id: %v", s, err)
		}
		// One text form per ID.
		if id.String() != s {
			t.Fatalf("ParseID(%q).String() = %q", s, id.String())
		}
	})
}
