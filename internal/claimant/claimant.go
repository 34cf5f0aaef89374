// Package claimant is the format of a fence's claimant when a consumer worker claims it: one
// definition for the consumer, which writes and compares claimants, and for the operator's
// tools, which read them.
//
// A claimant is one partition worker incarnation's identity at the sink:
//
//	<identity>/<16 hex digits: 64 random bits>[/<member id>]
//
// The random part makes every worker a claimant of its own (the sink lets one claimant hold a
// token, so a worker never writes under a token another worker claimed). The identity is what
// a member keeps across the two ways Kafka hands a member its own partitions back at the same
// generation or epoch, where the new worker presents the very token the previous one claimed:
//
//   - a static member (group.instance.id) restarted within the session timeout: the
//     coordinator replaces the old member id by a new one without a rebalance (KIP-345) and
//     keeps the generation; the identity is "static:" + the instance id (the member id, new,
//     follows the random part, for the reader only);
//   - a KIP-848 member fenced by a heartbeat rejoins in place with its member id and epoch;
//     the identity of a member that is not static is its member id.
//
// The consumer's claim decision takes an equal token held by a claimant of its own identity
// for such a handover (INFO, baton.consumer.handovers) rather than a regression (ERROR); both
// are recovered only after the coordinator's proof. Identities are escaped to
// [A-Za-z0-9._-] and %XX, so an identity never contains "/" or ":" ("static:" cannot be
// forged by a member id) and the claimant is a valid fence identifier (ASCII, no NUL, at most
// fencecheck.MaxIdentifierLen bytes: an identity escaping to more than maxIdentity bytes is
// replaced by "~" and a SHA-256 prefix, the member id is cut to fit).
package claimant

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/batonhq/baton/internal/fencecheck"
)

const (
	staticPrefix = "static:"
	randomHex    = 16  // hex digits of the random part
	maxIdentity  = 512 // bytes of an escaped identity before it is hashed
)

// Identity returns the identity of a group member: "static:" and its group.instance.id if
// static, otherwise its member id; "" if it has neither (never matched).
func Identity(instance, member string) string {
	switch {
	case instance != "":
		return staticPrefix + bounded(escapeIdentity(instance), instance)
	case member != "":
		return bounded(escapeIdentity(member), member)
	}
	return ""
}

// New returns a claimant unique to one partition worker incarnation, of the given
// identity (Identity), with the member id after it when the identity is not the member
// id (for the reader). 64 random bits, never reused across restarts.
func New(identity, member string) string {
	var b [randomHex / 2]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	if identity == "" {
		identity = "member"
	}
	c := identity + "/" + hex.EncodeToString(b[:])
	if strings.HasPrefix(identity, staticPrefix) && member != "" {
		m := escapeIdentity(member)
		if room := fencecheck.MaxIdentifierLen - len(c) - 1; len(m) > room {
			m = m[:max(room, 0)]
		}
		if m != "" {
			c += "/" + m
		}
	}
	return c
}

// IdentityOf returns the identity of a claimant New made, and false for any
// other string (an operator's claimant, a claimant of another shape).
func IdentityOf(c string) (string, bool) {
	i := strings.IndexByte(c, '/')
	if i <= 0 {
		return "", false
	}
	rest := c[i+1:]
	if len(rest) < randomHex || (len(rest) > randomHex && rest[randomHex] != '/') {
		return "", false
	}
	for j := range randomHex {
		if h := rest[j]; !('0' <= h && h <= '9' || 'a' <= h && h <= 'f') {
			return "", false
		}
	}
	return c[:i], true
}

// Same reports whether claimant c belongs to a worker of the given identity ("" is no
// identity: never).
func Same(identity, c string) bool {
	id, ok := IdentityOf(c)
	return ok && identity != "" && id == identity
}

// escapeIdentity keeps [A-Za-z0-9._-] and writes every other byte as %XX.
func escapeIdentity(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
			b.WriteByte(c)
		default:
			b.WriteByte('%')
			b.WriteString(strings.ToUpper(hex.EncodeToString([]byte{c})))
		}
	}
	return b.String()
}

// bounded returns esc, or "~" and 32 hex digits of raw's SHA-256 if esc is too long to leave
// room in a claimant ("~" is escaped, so no escaped identity starts with it).
func bounded(esc, raw string) string {
	if len(esc) <= maxIdentity {
		return esc
	}
	h := sha256.Sum256([]byte(raw))
	return "~" + hex.EncodeToString(h[:16])
}
