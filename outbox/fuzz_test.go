package outbox

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/fencecheck"
)

// mapKeyed is an in-memory fence.KeyedSink with the shared admission rule, so the fuzzers
// need no store (and no transaction).
type mapKeyed struct {
	mu sync.Mutex
	m  map[string]struct {
		t   fence.Token
		seq int64
	}
}

func (k *mapKeyed) Admit(_ context.Context, _ struct{}, scope, id string, t fence.Token, seq int64) (fence.Verdict, error) {
	if err := fencecheck.ValidateAdmit(scope, id, t, seq); err != nil {
		return 0, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[string]struct {
			t   fence.Token
			seq int64
		}{}
	}
	s, found := k.m[scope+"\x00"+id]
	v := fencecheck.CheckAdmit(s.t, s.seq, found, t, seq)
	if v == fence.Admitted {
		s.t, s.seq = t, seq
		k.m[scope+"\x00"+id] = s
	}
	return v, nil
}

// headersFrom splits b into headers: "key=value" lines. A fuzzer's bytes become any set of
// headers, baton-* ones included, well-formed or not, repeated or not.
func headersFrom(b []byte) []kgo.RecordHeader {
	var hs []kgo.RecordHeader
	for _, line := range bytes.Split(b, []byte{'\n'}) {
		if len(line) == 0 {
			continue
		}
		k, v, _ := bytes.Cut(line, []byte{'='})
		hs = append(hs, kgo.RecordHeader{Key: string(k), Value: v})
	}
	return hs
}

func seedRecords(f *testing.F) {
	f.Add("t", []byte("k"), []byte("v"), []byte("baton-token=0.1\nbaton-seq=1\nbaton-source=g/t/0"))
	f.Add("t", []byte("k"), []byte("v"), []byte("baton-token=999.999\nbaton-seq=9223372036854775807\nbaton-source=g/t/0\nbaton-signature=AAAA"))
	f.Add("t", []byte(""), []byte{}, []byte("baton-token=0.1\nbaton-seq=1\nbaton-source=g/t/0"))
	f.Add("t", []byte("k"), []byte("v"), []byte("baton-token=-1.1\nbaton-seq=-5\nbaton-source=//\nbaton-token=1.2"))
	f.Add("t", []byte("k"), []byte("v"), []byte("baton-token=0.01\nbaton-seq=+1\nbaton-source=g/t/2147483648"))
	f.Add("t", []byte("\x00\xff"), []byte("v"), []byte("baton-token=1.1\nbaton-seq=1\nbaton-source=a/b/c/1\nbaton-idempotency-key=x"))
	f.Add("", []byte("k"), []byte("v"), []byte("traceparent=00-zz\nbaton-signature=\nbaton-signature="))
}

// FuzzParseEnvelope: any headers give a valid envelope or an error wrapping ErrNotBaton, never
// a panic; a valid envelope's canonical headers parse back to the same envelope.
func FuzzParseEnvelope(f *testing.F) {
	seedRecords(f)
	f.Fuzz(func(t *testing.T, topic string, key, value, hdrs []byte) {
		rec := &kgo.Record{Topic: topic, Key: key, Value: value, Headers: headersFrom(hdrs)}
		env, err := ParseEnvelope(rec)
		if err != nil {
			if !errors.Is(err, ErrNotBaton) {
				t.Fatalf("ParseEnvelope error %v does not wrap ErrNotBaton", err)
			}
			return
		}
		if env.Seq < 1 || fencecheck.ValidateToken(env.Token) != nil || fencecheck.ValidateKey(env.Source) != nil {
			t.Fatalf("ParseEnvelope accepted an invalid envelope %+v", env)
		}
		tok, _ := env.Token.MarshalText()
		again, err := ParseEnvelope(&kgo.Record{Headers: []kgo.RecordHeader{
			{Key: headerToken, Value: tok}, {Key: headerSeq, Value: []byte(itoa(env.Seq))},
			{Key: headerSource, Value: []byte(env.Source.String())}, {Key: headerIdempotencyKey, Value: []byte(env.IdempotencyKey)},
		}})
		if err != nil || again != env {
			t.Fatalf("canonical form of %+v parsed to %+v, %v", env, again, err)
		}
	})
}

func itoa(n int64) string {
	b := make([]byte, 0, 20)
	if n == 0 {
		return "0"
	}
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

var fuzzKey = []byte(strings.Repeat("k", minSigningKeyLen))

// FuzzInboxAdmit: a record with any headers, forged or malformed baton-* ones included,
// neither panics the inbox nor gets past it unless well-formed; an inbox with SigningKeys
// admits none of them (a fuzzer cannot forge the HMAC), counts it as forged, and afterwards
// still admits the genuine record of the same key: nothing is lost.
func FuzzInboxAdmit(f *testing.F) {
	seedRecords(f)
	f.Fuzz(func(t *testing.T, topic string, key, value, hdrs []byte) {
		ctx := context.Background()
		rec := &kgo.Record{Topic: topic, Key: key, Value: value, Headers: headersFrom(hdrs)}
		trusting, err := NewInbox[struct{}]("trusting", &mapKeyed{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := trusting.Admit(ctx, struct{}{}, rec); err != nil &&
			!errors.Is(err, ErrNotBaton) && !errors.Is(err, ErrNoKey) && !errors.Is(err, fence.ErrInvalid) {
			t.Fatalf("trusting inbox: unexpected error %v", err)
		}

		keyed := &mapKeyed{}
		signed, err := NewInbox[struct{}]("signed", keyed, SigningKeys(fuzzKey))
		if err != nil {
			t.Fatal(err)
		}
		v, err := signed.Admit(ctx, struct{}{}, rec)
		if err == nil || !errors.Is(err, ErrBadSignature) || !errors.Is(err, ErrNotBaton) {
			t.Fatalf("signing inbox admitted an unsigned or forged record: %v, %v", v, err)
		}
		if len(key) == 0 {
			return
		}
		// The genuine record of the same key, from a relay holding the key, is admitted.
		genuine := &kgo.Record{Topic: "t", Key: key, Value: []byte("v"), Headers: []kgo.RecordHeader{
			{Key: headerToken, Value: []byte("0.1")}, {Key: headerSeq, Value: []byte("1")},
			{Key: headerSource, Value: []byte("g/t/0")},
		}}
		genuine.Headers = append(genuine.Headers, kgo.RecordHeader{Key: headerSignature, Value: []byte(signature(fuzzKey, genuine))})
		if v, err := signed.Admit(ctx, struct{}{}, genuine); err != nil || v != fence.Admitted {
			t.Fatalf("the genuine record after a forged one: %v, %v", v, err)
		}
	})
}
