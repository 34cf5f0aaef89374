package outboxstore

import (
	"bytes"
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/outbox"
)

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
			if !errors.Is(err, outbox.ErrInvalid) {
				t.Fatalf("error %v does not wrap outbox.ErrInvalid", err)
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
	ok := outbox.Message{Topic: "dest.v1_x-y", Key: []byte("k"), Headers: []kgo.RecordHeader{{Key: "batonx"}}}
	if err := ValidateAppend(src, fence.Token{}, []outbox.Message{ok}, 10); err != nil {
		t.Fatalf("valid message refused: %v", err)
	}
	cases := []struct {
		src  fence.Key
		tok  fence.Token
		m    outbox.Message
		want error
	}{
		{src, fence.Token{}, outbox.Message{}, ErrNoTopic},
		{src, fence.Token{}, outbox.Message{Topic: "d", Value: make([]byte, 11)}, outbox.ErrTooLarge},
		{src, fence.Token{}, outbox.Message{Topic: "d", Headers: []kgo.RecordHeader{{Key: "BATON-token"}}}, ErrInvalidHeader},
		{src, fence.Token{}, outbox.Message{Topic: "d", Headers: []kgo.RecordHeader{{Key: "TraceState"}}}, ErrInvalidHeader},
		{src, fence.Token{}, outbox.Message{Topic: "d", Headers: []kgo.RecordHeader{{Key: "\xff"}}}, ErrInvalidHeader},
		{src, fence.Token{}, outbox.Message{Topic: "d e"}, outbox.ErrInvalid},
		{src, fence.Token{}, outbox.Message{Topic: ".."}, outbox.ErrInvalid},
		{src, fence.Token{}, outbox.Message{Topic: "d", IdempotencyKey: "\xff"}, outbox.ErrInvalid},
		{fence.Key{Topic: "t"}, fence.Token{}, ok, outbox.ErrInvalid},
		{src, fence.Token{Epoch: -1}, ok, outbox.ErrInvalid},
	}
	for i, c := range cases {
		if err := ValidateAppend(c.src, c.tok, []outbox.Message{ok, c.m}, 10); !errors.Is(err, c.want) {
			t.Errorf("case %d: %v, want %v", i, err, c.want)
		}
	}
}
