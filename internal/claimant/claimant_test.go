package claimant

import (
	"strings"
	"testing"

	"github.com/batonhq/baton/internal/fencecheck"
)

// The claimant's identity: what makes an equal-token refusal a handover (Identity, Same).
func TestClaimantIdentity(t *testing.T) {
	long := strings.Repeat("x", 2*fencecheck.MaxIdentifierLen)
	cases := []struct {
		name, instance, member string
		identity               string // "" to skip the exact check
	}{
		{name: "dynamic", member: "kgo-6f1c", identity: "kgo-6f1c"},
		{name: "static", instance: "inst-a", member: "inst-a-6f1c", identity: "static:inst-a"},
		{name: "slash and colon escaped", instance: "a/b:c", member: "m/1", identity: "static:a%2Fb%3Ac"},
		{name: "a member id cannot forge static", member: "static:inst-a", identity: "static%3Ainst-a"},
		{name: "NUL and non-UTF-8", member: "m\x00\xff", identity: "m%00%FF"},
		{name: "long member", member: long},
		{name: "long instance", instance: long, member: long},
		{name: "none"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id := Identity(c.instance, c.member)
			if c.identity != "" && id != c.identity {
				t.Errorf("identity %q, want %q", id, c.identity)
			}
			a, b := New(id, c.member), New(id, c.member)
			if a == b {
				t.Errorf("two claimants of one identity are equal: %q", a)
			}
			for _, cl := range []string{a, b} {
				if err := fencecheck.ValidateIdentifier("claimant", cl); err != nil {
					t.Errorf("claimant %q: %v", cl, err)
				}
			}
			if id == "" {
				if Same(id, a) {
					t.Errorf("no identity matched %q", a)
				}
				return
			}
			if !Same(id, a) || !Same(id, b) {
				t.Errorf("claimants %q, %q not of identity %q", a, b, id)
			}
			if other := Identity(c.instance+"2", c.member+"2"); Same(other, a) {
				t.Errorf("claimant %q taken for identity %q", a, other)
			}
		})
	}
	// Claimants of other shapes (an operator's, an older Baton's static member, a test's) have
	// no identity, or not a static member's.
	for _, c := range []string{"operator:me@host", "test", "N", "static:inst-a", "static:inst-a/xyz", "static:inst-a/0123456789ABCDEF",
		"inst-a-6f1c/0123456789abcdef"} {
		if Same("static:inst-a", c) {
			t.Errorf("%q taken for a claimant of static:inst-a", c)
		}
	}
	if !Same("kgo-1", "kgo-1/0123456789abcdef") { // the shape before static identities
		t.Error("a dynamic member's claimant of the previous shape not recognised")
	}
}
