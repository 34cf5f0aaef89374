package outbox

import (
	"bytes"
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/batonhq/baton/fence"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestHeadersRoundTrip(t *testing.T) {
	for _, hs := range [][]kgo.RecordHeader{
		nil,
		{{Key: "a", Value: nil}},
		{{Key: "a", Value: []byte{}}, {Key: "ключ", Value: []byte{0, 1, 2}}},
	} {
		got, err := UnmarshalHeaders(MarshalHeaders(hs))
		if err != nil || !equalHeaders(got, hs) {
			t.Fatalf("round trip of %v = %v, %v", hs, got, err)
		}
	}
}

func equalHeaders(a, b []kgo.RecordHeader) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Key != b[i].Key || !bytes.Equal(a[i].Value, b[i].Value) || (a[i].Value == nil) != (b[i].Value == nil) {
			return false
		}
	}
	return true
}

func FuzzUnmarshalHeaders(f *testing.F) {
	f.Add(MarshalHeaders([]kgo.RecordHeader{{Key: "a", Value: []byte("b")}, {Key: "c"}}))
	f.Add([]byte{0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		hs, err := UnmarshalHeaders(b)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		again, err := UnmarshalHeaders(MarshalHeaders(hs))
		if err != nil || !equalHeaders(again, hs) {
			t.Fatalf("re-encoding %v gave %v, %v", hs, again, err)
		}
	})
}

func TestValidateAppend(t *testing.T) {
	src := fence.Key{Group: "g", Topic: "t", Partition: 0}
	ok := Message{Topic: "dest.v1_x-y", Key: []byte("k"), Headers: []kgo.RecordHeader{{Key: "batonx"}}}
	if err := ValidateAppend(src, fence.Token{}, []Message{ok}, 10); err != nil {
		t.Fatalf("valid message refused: %v", err)
	}
	cases := []struct {
		src  fence.Key
		tok  fence.Token
		m    Message
		want error
	}{
		{src, fence.Token{}, Message{}, ErrNoTopic},
		{src, fence.Token{}, Message{Topic: "d", Value: make([]byte, 11)}, ErrTooLarge},
		{src, fence.Token{}, Message{Topic: "d", Headers: []kgo.RecordHeader{{Key: "BATON-token"}}}, ErrInvalidHeader},
		{src, fence.Token{}, Message{Topic: "d", Headers: []kgo.RecordHeader{{Key: "TraceState"}}}, ErrInvalidHeader},
		{src, fence.Token{}, Message{Topic: "d", Headers: []kgo.RecordHeader{{Key: "\xff"}}}, ErrInvalidHeader},
		{src, fence.Token{}, Message{Topic: "d e"}, ErrInvalid},
		{src, fence.Token{}, Message{Topic: ".."}, ErrInvalid},
		{src, fence.Token{}, Message{Topic: "d", IdempotencyKey: "\xff"}, ErrInvalid},
		{fence.Key{Topic: "t"}, fence.Token{}, ok, ErrInvalid},
		{src, fence.Token{Epoch: -1}, ok, ErrInvalid},
	}
	for i, c := range cases {
		if err := ValidateAppend(c.src, c.tok, []Message{ok, c.m}, 10); !errors.Is(err, c.want) {
			t.Errorf("case %d: %v, want %v", i, err, c.want)
		}
	}
}

func TestParseSource(t *testing.T) {
	for _, k := range []fence.Key{{Group: "g", Topic: "t", Partition: 0}, {Group: "a/b/c", Topic: "t.x", Partition: 12}} {
		got, err := parseSource(k.String())
		if err != nil || got != k {
			t.Fatalf("parseSource(%q) = %v, %v", k.String(), got, err)
		}
	}
	for _, s := range []string{"", "g/t", "g/t/x", "/t/1", "g//1", "g/t/-1", "g/t/01"} {
		if _, err := parseSource(s); !errors.Is(err, ErrNotBaton) {
			t.Errorf("parseSource(%q) = %v, want ErrNotBaton", s, err)
		}
	}
}

func TestEntityIDsDoNotCollide(t *testing.T) {
	keys := [][]byte{[]byte("x:00"), {0}, []byte("k:a"), []byte("a"), bytes.Repeat([]byte("a"), 600), bytes.Repeat([]byte("a"), 601)}
	seen := map[string]bool{}
	for _, k := range keys {
		id := entityID(k)
		if seen[id] || fence.ValidateIdentifier("id", id) != nil {
			t.Fatalf("entityID(%q) = %q collides or is invalid", k, id)
		}
		seen[id] = true
	}
}

func TestNewRelayRefusesNonIdempotentClient(t *testing.T) {
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"), kgo.DisableIdempotentWrite())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := NewRelay(cl, nopStore{}); !errors.Is(err, ErrNotIdempotent) {
		t.Fatalf("NewRelay = %v, want ErrNotIdempotent", err)
	}
	good, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	if _, err := NewRelay(good, nopStore{}); err != nil {
		t.Fatal(err)
	}
	if _, err := NewInbox[int]("r", nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("NewInbox(nil) = %v", err)
	}
}

type nopStore struct{ Store }
