package secure_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/batonhq/baton/internal/secure"
)

// TestOptsErrors: every problem of a configuration is reported at once, naming files and never
// a password; a zero configuration asks for nothing.
func TestOptsErrors(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte("s3cret-password-value\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	notPEM := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(notPEM, []byte("s3cret-password-value"), 0o600); err != nil {
		t.Fatal(err)
	}
	if opts, err := (secure.Kafka{}).Opts(); err != nil || len(opts) != 0 {
		t.Fatalf("zero Kafka: %d options, %v", len(opts), err)
	}
	if opts, err := (secure.Kafka{User: "u", PasswordFile: pw}).Opts(); err != nil || len(opts) != 1 {
		t.Fatalf("SASL only: %d options, %v", len(opts), err)
	}
	k := secure.Kafka{CAFile: notPEM, CertFile: filepath.Join(dir, "missing.crt"), User: "u",
		PasswordFile: empty, Mechanism: "PLAIN"}
	_, err := k.Opts()
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"holds no PEM certificate", "needs both a certificate and a key", "is empty", `"PLAIN"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("the error holds a secret: %v", err)
	}
	if _, err := (secure.Kafka{User: "u"}).Opts(); err == nil || !strings.Contains(err.Error(), "password file") {
		t.Errorf("no password file: %v", err)
	}
}

// TestEnvRoundTrip: Env and FromEnv carry every field, as paths and names.
func TestEnvRoundTrip(t *testing.T) {
	want := secure.Kafka{CAFile: "/ca", CertFile: "/c", KeyFile: "/k", ServerName: "kafka", Mechanism: "SCRAM-SHA-256",
		User: "u", PasswordFile: "/pw"}
	for _, kv := range want.Env("TEST_SECURE_") {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	if got := secure.FromEnv("TEST_SECURE_"); got != want {
		t.Fatalf("round trip: %+v, want %+v", got, want)
	}
	if !want.Enabled() || (secure.Kafka{}).Enabled() {
		t.Fatal("Enabled")
	}
}
