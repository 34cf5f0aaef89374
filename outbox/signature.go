package outbox

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"

	"github.com/twmb/franz-go/pkg/kgo"
)

// headerSignature carries the relay's HMAC-SHA256 of a record when the relay has
// [SigningKeys]; an inbox with SigningKeys admits only records whose signature verifies.
const headerSignature = "baton-signature"

// minSigningKeyLen is the shortest signing key accepted, in bytes.
const minSigningKeyLen = 32

// ErrBadSignature means an inbox with [SigningKeys] got a record whose baton-signature is
// missing or does not verify: it was not published by a relay holding one of the keys (a
// forged or altered record). The error Admit returns wraps both it and [ErrNotBaton], so
// outboxconsumer.Handler dead-letters the record.
var ErrBadSignature = errors.New("outbox: baton-signature missing or invalid")

// SigningKeys makes records authenticated end to end, for topics that producers other than
// Baton relays can write to. A relay signs every record with the first key (HMAC-SHA256 over
// the destination topic, the record key and value, the message's own headers and the baton
// headers) in the baton-signature header; an inbox admits a record only if its signature
// verifies under one of the keys (list the new key first and keep the old one while rotating),
// and refuses any other with [ErrBadSignature] before it touches the keyed fence, so a forged
// token cannot shadow the genuine records of its key. Keys are secrets of at least
// 32 bytes; they appear in no error, log or metric.
//
// Without SigningKeys the inbox trusts the topic: it admits any record with well-formed baton
// headers, so only the relay's principal may have WRITE on the topics an inbox reads
// (SECURITY.md).
func SigningKeys(keys ...[]byte) Option {
	return func(c *config) error {
		if len(keys) == 0 {
			return fmt.Errorf("%w: SigningKeys needs at least one key", ErrInvalid)
		}
		var errs []error
		for i, k := range keys {
			if len(k) < minSigningKeyLen {
				errs = append(errs, fmt.Errorf("%w: signing key %d is %d bytes, want at least %d", ErrInvalid, i, len(k), minSigningKeyLen))
			}
		}
		if err := errors.Join(errs...); err != nil {
			return err
		}
		c.keys = make([][]byte, len(keys))
		for i, k := range keys {
			c.keys[i] = append([]byte(nil), k...)
		}
		return nil
	}
}

// signature returns the base64url HMAC-SHA256 of rec under key. Every field is written with
// its length first, so no two different records hash the same input. The trace-context
// headers (which tracing systems may rewrite) and the signature itself are left out.
func signature(key []byte, rec *kgo.Record) string {
	m := hmac.New(sha256.New, key)
	field := func(h hash.Hash, b []byte) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	m.Write([]byte("baton-signature-v1"))
	field(m, []byte(rec.Topic))
	field(m, rec.Key)
	field(m, rec.Value)
	for _, h := range rec.Headers {
		if h.Key == headerSignature || h.Key == headerTraceParent || h.Key == headerTraceState {
			continue
		}
		field(m, []byte(h.Key))
		field(m, h.Value)
	}
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// verify checks rec's signature under any of keys.
func verify(keys [][]byte, rec *kgo.Record) error {
	var got []byte
	n := 0
	for _, h := range rec.Headers {
		if h.Key == headerSignature {
			got, n = h.Value, n+1
		}
	}
	if n != 1 {
		return fmt.Errorf("%w: %w: %d %s headers", ErrNotBaton, ErrBadSignature, n, headerSignature)
	}
	for _, k := range keys {
		if hmac.Equal(got, []byte(signature(k, rec))) {
			return nil
		}
	}
	return fmt.Errorf("%w: %w: does not verify under any signing key", ErrNotBaton, ErrBadSignature)
}
