package outbox

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/metric/noop"
	"go.uber.org/goleak"

	"github.com/batonhq/baton/fence"
	"github.com/batonhq/baton/internal/fencecheck"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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

// Every key up to the hashed form's threshold and past it maps to a valid id, at each
// boundary of the three forms, and the forms of the keys below the boundaries are the ones
// stored ids already hold (an id that changed would admit a record twice across an upgrade).
func TestEntityIDOfEveryKeyLengthIsValid(t *testing.T) {
	for _, n := range []int{1, 510, 511, 512, 513, 1022, 1023, 1024, 4096} {
		for _, c := range []struct {
			name string
			key  []byte
			form string
		}{
			{"text", bytes.Repeat([]byte("a"), n), map[bool]string{true: "k:", false: "h:"}[n <= 512]},
			{"binary", bytes.Repeat([]byte{0xff}, n), map[bool]string{true: "x:", false: "h:"}[n <= 511]},
			{"with NUL", bytes.Repeat([]byte{0}, n), map[bool]string{true: "x:", false: "h:"}[n <= 511]},
		} {
			id := entityID(c.key)
			if err := fencecheck.ValidateIdentifier("id", id); err != nil {
				t.Errorf("%s key of %d bytes: id %.20q... invalid: %v", c.name, n, id, err)
			}
			if !strings.HasPrefix(id, c.form) {
				t.Errorf("%s key of %d bytes: id %.20q..., want the %q form", c.name, n, id, c.form)
			}
		}
	}
}

// The ids of each form are exactly the ones stored before (the admissions of records already
// applied are found again).
func TestEntityIDForms(t *testing.T) {
	long := bytes.Repeat([]byte("a"), 600)
	sum := sha256.Sum256(long)
	for _, c := range []struct {
		key  []byte
		want string
	}{
		{[]byte("a"), "k:a"},
		{[]byte("h:abc"), "k:h:abc"},
		{[]byte{0xff}, "x:ff"},
		{[]byte{'a', 0}, "x:6100"},
		{bytes.Repeat([]byte{0xff}, 511), "x:" + strings.Repeat("ff", 511)},
		{long, "h:" + hex.EncodeToString(sum[:])},
	} {
		if got := entityID(c.key); got != c.want {
			t.Errorf("entityID(%.20q) = %.40q, want %.40q", c.key, got, c.want)
		}
	}
}

func TestEntityIDsDoNotCollide(t *testing.T) {
	keys := [][]byte{[]byte("x:00"), {0}, []byte("k:a"), []byte("a"), bytes.Repeat([]byte("a"), 600), bytes.Repeat([]byte("a"), 601),
		bytes.Repeat([]byte{0xff}, 511), bytes.Repeat([]byte{0xff}, 512), bytes.Repeat([]byte{0xff}, 513)}
	seen := map[string]bool{}
	for _, k := range keys {
		id := entityID(k)
		if seen[id] || fencecheck.ValidateIdentifier("id", id) != nil {
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
	if _, err := NewRelay(cl, nopStore{}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "idempotently") {
		t.Fatalf("NewRelay = %v, want ErrInvalid naming the idempotent producer", err)
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

func TestAdmissionScope(t *testing.T) {
	src := fence.Key{Group: "g", Topic: "orders", Partition: 3}
	if got, want := admissionScope("billing", src, "invoices", 7), "billing|g/orders/3|invoices/7"; got != want {
		t.Fatalf("admissionScope = %q, want %q", got, want)
	}
	seen := map[string]bool{}
	long := fence.Key{Group: strings.Repeat("g", fencecheck.MaxIdentifierLen), Topic: "orders", Partition: 3}
	for _, s := range []string{
		admissionScope("billing", src, "invoices", 7),
		admissionScope("billing", src, "invoices", 8),
		admissionScope("billing", src, "receipts", 7),
		admissionScope("billing", long, "invoices", 7),
		admissionScope("billing", long, "invoices", 8),
	} {
		if seen[s] || fencecheck.ValidateIdentifier("scope", s) != nil {
			t.Fatalf("scope %q collides or is invalid", s)
		}
		seen[s] = true
	}
}

func TestRelayOptions(t *testing.T) {
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	_, err = NewRelay(cl, nopStore{}, FlushTimeout(0), GiveUpAfter(-time.Second), BatchSize(0), nil)
	for _, want := range []string{"flush timeout", "give-up time", "batch size", "option 3 is nil"} {
		if !errors.Is(err, ErrInvalid) || !strings.Contains(fmt.Sprint(err), want) {
			t.Errorf("NewRelay with bad options = %v; want ErrInvalid naming %q", err, want)
		}
	}
	if _, err := NewRelay(cl, nopStore{}, FlushTimeout(time.Second), GiveUpAfter(time.Minute)); err != nil {
		t.Fatal(err)
	}
	// The relay's own options are not an inbox's: NewInbox("r", keyed, FlushTimeout(d)) does
	// not compile. The shared ones serve both.
	if _, err := NewRelay(cl, nopStore{}, Telemetry(noop.NewMeterProvider(), nil), FlushTimeout(time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := NewInbox[int]("r", nopKeyed{}, Telemetry(noop.NewMeterProvider(), nil), nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("NewInbox with a nil option = %v, want ErrInvalid", err)
	}
}

type nopKeyed struct{ fence.KeyedSink[int] }
