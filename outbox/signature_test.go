package outbox

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/fence"
)

// TestSignedRecords: a relay with SigningKeys signs what it publishes; an inbox holding the key
// admits it, refuses it altered in any field, and refuses it under another key; rotation (the
// old key still listed) admits records signed with either.
func TestSignedRecords(t *testing.T) {
	ctx := context.Background()
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	oldKey, newKey := []byte(strings.Repeat("o", 32)), []byte(strings.Repeat("n", 32))
	relay, err := NewRelay(cl, nopStore{}, SigningKeys(oldKey))
	if err != nil {
		t.Fatal(err)
	}
	row := &Row{Message: Message{Topic: "commands", Key: []byte("dev-1"), Value: []byte("on"),
		Headers: []kgo.RecordHeader{{Key: "app", Value: []byte("x")}}},
		Source: fence.Key{Group: "g", Topic: "events", Partition: 2}, Token: fence.Token{Era: 0, Epoch: 3}, Seq: 1, IdempotencyKey: "g/events/2/1"}
	rec := relay.record(ctx, row)

	admit := func(rec *kgo.Record, keys ...[]byte) error {
		in, err := NewInbox[struct{}]("r", &mapKeyed{}, SigningKeys(keys...))
		if err != nil {
			t.Fatal(err)
		}
		_, err = in.Admit(ctx, struct{}{}, rec)
		return err
	}
	if err := admit(rec, oldKey); err != nil {
		t.Fatalf("the genuine record: %v", err)
	}
	if err := admit(rec, newKey, oldKey); err != nil {
		t.Fatalf("the genuine record while rotating: %v", err)
	}
	if err := admit(rec, newKey); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("under another key: %v, want ErrBadSignature", err)
	}
	for name, alter := range map[string]func(r *kgo.Record){
		"value": func(r *kgo.Record) { r.Value = []byte("off") },
		"key":   func(r *kgo.Record) { r.Key = []byte("dev-2") },
		"topic": func(r *kgo.Record) { r.Topic = "other" },
		"token": func(r *kgo.Record) {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: headerToken, Value: []byte("5.0")})
		},
		"user header":  func(r *kgo.Record) { r.Headers[0].Value = []byte("y") },
		"no signature": func(r *kgo.Record) { r.Headers = r.Headers[:len(r.Headers)-1] },
	} {
		c := *rec
		c.Headers = append([]kgo.RecordHeader(nil), rec.Headers...)
		if name == "no signature" {
			// The signature is the last header unless a trace context follows it.
			for i, h := range c.Headers {
				if h.Key == headerSignature {
					c.Headers = append(c.Headers[:i], c.Headers[i+1:]...)
					break
				}
			}
		} else {
			alter(&c)
		}
		if err := admit(&c, oldKey); !errors.Is(err, ErrBadSignature) || !errors.Is(err, ErrNotBaton) {
			t.Errorf("altered %s: %v, want ErrBadSignature", name, err)
		}
		if err := admit(&c, oldKey); err != nil && strings.Contains(err.Error(), string(oldKey)) {
			t.Errorf("the error holds the key")
		}
	}
	for _, bad := range [][][]byte{nil, {[]byte("short")}} {
		if _, err := NewInbox[struct{}]("r", &mapKeyed{}, SigningKeys(bad...)); !errors.Is(err, ErrInvalid) {
			t.Errorf("SigningKeys(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}
