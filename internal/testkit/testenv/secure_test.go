package testenv_test

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/batonhq/baton/internal/secure"
	"github.com/batonhq/baton/internal/testkit/testenv"
)

// TestSecureKafkaFailures: every way a client's TLS or SASL settings can be wrong fails the
// first request with an error that names the cause, and no error holds a password.
func TestSecureKafkaFailures(t *testing.T) {
	t.Parallel()
	e := testenv.SecureKafka(t)
	bad := testenv.MakeBadCerts(t, e.Runtime.CAFile)
	secrets := testenv.Secrets(t)
	wrongPW := filepath.Join(t.TempDir(), "wrong.pass")
	if err := os.WriteFile(wrongPW, []byte("not-the-password-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		edit func(*secure.Kafka)
		want string
	}{
		{"ok", func(*secure.Kafka) {}, ""},
		{"wrong password", func(k *secure.Kafka) { k.PasswordFile = wrongPW }, "invalid credentials"},
		{"untrusted CA", func(k *secure.Kafka) { k.CAFile = bad.UntrustedCA }, "certificate signed by unknown authority"},
		{"wrong host name", func(k *secure.Kafka) { k.ServerName = "wrong.example" }, "not wrong.example"},
		// The broker refuses an expired client certificate, but says only "unknown certificate":
		// the options refuse it first, with the dates (below).
		{"expired client certificate", func(k *secure.Kafka) { k.CertFile, k.KeyFile = "", "" }, "tls: unknown certificate"},
		{"no client certificate", func(k *secure.Kafka) { k.CertFile, k.KeyFile = "", "" }, "tls"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			k := e.Runtime
			c.edit(&k)
			opts := e.Opts(t, k)
			if c.name == "expired client certificate" {
				pair, err := tls.LoadX509KeyPair(bad.ExpiredCert, bad.ExpiredKey)
				if err != nil {
					t.Fatal(err)
				}
				tc, err := k.TLSConfig()
				if err != nil {
					t.Fatal(err)
				}
				tc.Certificates = []tls.Certificate{pair}
				opts = append(opts, kgo.DialTLSConfig(tc))
			}
			cl, err := kgo.NewClient(opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			start := time.Now()
			err = cl.Ping(ctx)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("ping with the right settings: %v", err)
			case c.want != "" && err == nil:
				t.Fatal("ping succeeded")
			case c.want != "" && !strings.Contains(err.Error(), c.want):
				t.Fatalf("error %q does not name the cause (want %q)", err, c.want)
			case c.want != "" && ctx.Err() != nil:
				t.Fatalf("ping failed only when its deadline passed: %v", err)
			}
			if err != nil {
				t.Logf("after %v: %v", time.Since(start).Round(time.Millisecond), err)
				testenv.NoSecrets(t, "the error", err.Error(), secrets)
			}
		})
	}
}

// TestSecureOptionsRefuseExpiredCertificate: the options say at start that the client
// certificate has expired, with its dates, rather than leave it to the broker's vague alert.
func TestSecureOptionsRefuseExpiredCertificate(t *testing.T) {
	t.Parallel()
	e := testenv.SecureKafka(t)
	bad := testenv.MakeBadCerts(t, e.Runtime.CAFile)
	k := e.Runtime
	k.CertFile, k.KeyFile = bad.ExpiredCert, bad.ExpiredKey
	_, err := k.Opts()
	if err == nil || !strings.Contains(err.Error(), "not now") {
		t.Fatalf("Opts with an expired client certificate = %v, want an error giving its dates", err)
	}
	t.Log(err)
}

// TestSecureExpiredServerCertificate: a server presenting an expired certificate, even one
// signed by the trusted CA, is refused by the client at the handshake, with a clear error.
func TestSecureExpiredServerCertificate(t *testing.T) {
	t.Parallel()
	e := testenv.SecureKafka(t)
	bad := testenv.MakeBadCerts(t, e.Runtime.CAFile)
	pair, err := tls.LoadX509KeyPair(bad.ExpiredServerCert, bad.ExpiredServerKey)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair}})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	defer func() { ln.Close(); <-done }()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	cl, err := kgo.NewClient(append(e.RuntimeOpts(t), kgo.SeedBrokers("localhost:"+port))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	err = cl.Ping(ctx)
	if err == nil || !strings.Contains(err.Error(), "certificate has expired") {
		t.Fatalf("ping a server with an expired certificate = %v, want the expiry named", err)
	}
	t.Log(err)
}

// TestSecurePostgresFailures: the TLS-only server refuses plaintext, and a wrong CA, a wrong
// host name or a wrong password each fail the connection with an error that names the cause
// and holds no password.
func TestSecurePostgresFailures(t *testing.T) {
	t.Parallel()
	rt, _ := testenv.SecurePostgresURLs(t)
	bad := testenv.MakeBadCerts(t, os.Getenv(testenv.EnvSecureKafkaPrefix+secure.EnvCA))
	secrets := append(testenv.Secrets(t), "not-the-password-0123456789")
	for _, c := range []struct {
		name string
		edit func(*pgx.ConnConfig)
		url  func(string) string
		want string
	}{
		{"ok", nil, nil, ""},
		{"plaintext", nil, func(u string) string { return strings.Replace(u, "sslmode=verify-full", "sslmode=disable", 1) },
			"no encryption"},
		{"untrusted CA", nil, func(u string) string {
			return strings.Replace(u, "sslrootcert="+os.Getenv(testenv.EnvSecureKafkaPrefix+secure.EnvCA), "sslrootcert="+bad.UntrustedCA, 1)
		}, "certificate signed by unknown authority"},
		{"wrong host name", func(c *pgx.ConnConfig) { c.TLSConfig.ServerName = "wrong.example" }, nil, "not wrong.example"},
		{"wrong password", func(c *pgx.ConnConfig) { c.Password = "not-the-password-0123456789" }, nil, "password authentication failed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			u := rt
			if c.url != nil {
				u = c.url(u)
			}
			cfg, err := pgx.ParseConfig(u)
			if err != nil {
				t.Fatal(err)
			}
			if c.edit != nil {
				c.edit(cfg)
				cfg.Fallbacks = nil
			}
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			conn, err := pgx.ConnectConfig(ctx, cfg)
			if err == nil {
				var ssl bool
				err = conn.QueryRow(ctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl)
				conn.Close(ctx)
				if c.want == "" && (err != nil || !ssl) {
					t.Fatalf("the right settings: ssl %v, %v", ssl, err)
				}
			}
			switch {
			case c.want != "" && err == nil:
				t.Fatal("connected")
			case c.want != "" && !strings.Contains(err.Error(), c.want):
				t.Fatalf("error %q does not name the cause (want %q)", err, c.want)
			}
			if err != nil {
				t.Logf("%v", err)
				testenv.NoSecrets(t, "the error", err.Error(), secrets)
			}
		})
	}
}
